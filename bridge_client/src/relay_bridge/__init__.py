"""The Relay bridge for Puppet: talks to a Relay service's `/_puppet/runs` API."""

__version__ = "0.1.0"
