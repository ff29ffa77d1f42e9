from rest_framework.renderers import JSONRenderer


class ProblemJSONRenderer(JSONRenderer):
    """Lets clients that ask only for application/problem+json be answered. (Its own module:
    DRF imports renderers while relay.api.problems is still importing DRF.)"""

    media_type = "application/problem+json"
