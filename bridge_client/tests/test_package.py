import subprocess
import sys


def test_its_commands_import_without_the_relay_service():
    """The bridge ships on its own to Puppet servers: every module of it, the two commands
    first, imports with what the package depends on, and never pulls in Django."""
    code = """
import importlib, pkgutil, sys
import relay_bridge, relay_bridge.cli, relay_bridge.step
for module in pkgutil.walk_packages(relay_bridge.__path__, "relay_bridge."):
    importlib.import_module(module.name)
relay_bridge.cli.parser().parse_args(["poll", "--once"])
relay_bridge.step.parser().parse_args(["--nodes", "a"])
print(relay_bridge.__version__, "django" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, django_loaded = out.stdout.split()
    assert version == "0.1.0"
    assert django_loaded == "False"
