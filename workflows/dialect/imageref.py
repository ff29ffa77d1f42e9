"""Image references: the grammar of the OCI distribution reference (distribution/reference,
regexp.go and reference.go), anchored, with its limits: a name of at most 255 characters, a
tag of at most 128, a digest of at least 32 hex digits (64 for sha256, 128 for sha512).

A step's `image` is checked against it when a document is validated or saved, and again by
the container runtime's command line (scriptsteps/container.py): nothing that matches can
start with `-`, so an image can never be read as an option of `docker run`/`podman run`.
"""

import re

_ALPHANUMERIC = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALPHANUMERIC}(?:{_SEPARATOR}{_ALPHANUMERIC})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_NAME = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*"
_IPV6 = r"\[(?:[a-fA-F0-9:]+)\]"
_DOMAIN_AND_PORT = rf"(?:{_DOMAIN_NAME}|{_IPV6})(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN_AND_PORT}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"

REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?", re.ASCII)
NAME_MAX = 255
DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}


def problem_with(image: str) -> str:
    """Why `image` is not an image reference ("" when it is)."""
    match = REFERENCE.fullmatch(image)
    if match is None:
        return (
            f"{image[:100]!r} is not an image reference: [registry[:port]/]name[:tag][@digest], "
            "a lowercase name such as relaysh/core:latest-python or registry.example.com/team/tool:1.2."
        )
    if len(match["name"]) > NAME_MAX:
        return f"An image's name is at most {NAME_MAX} characters; this one has {len(match['name'])}."
    if match["digest"]:
        algorithm, _, hexdigits = match["digest"].partition(":")
        wanted = DIGEST_HEX.get(algorithm)
        if wanted is not None and len(hexdigits) != wanted:
            return f"A {algorithm} digest has {wanted} hex digits; this one has {len(hexdigits)}."
    return ""


def is_reference(image: str) -> bool:
    return not problem_with(image)
