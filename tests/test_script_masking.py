"""The log's masking on its own: a secret is masked wherever the output is cut, in its JSON,
base64 and URL-encoded forms and inside Basic credentials too, and nothing but secrets is
held back or changed."""

import base64
import json
import re
import time
from urllib.parse import quote, quote_plus

from scriptsteps.masking import MASK, Masker

SECRET = 'Sup3r-s3cret-"Valu3"\\x'


def fed(masker: Masker, pieces: list[str]) -> str:
    return "".join(masker.feed(piece) for piece in pieces) + masker.flush()


def test_a_secret_is_masked_wherever_the_output_is_cut():
    text = f"before {SECRET} middle {SECRET}{SECRET} after"
    for cut in range(len(text) + 1):
        for second in range(cut, len(text) + 1, 3):
            out = fed(Masker([SECRET]), [text[:cut], text[cut:second], text[second:]])
            assert out == f"before {MASK} middle {MASK}{MASK} after", (cut, second)


def test_a_secret_cut_into_single_characters_is_masked_and_nothing_is_stored_early():
    masker = Masker([SECRET])
    stored = [masker.feed(ch) for ch in "x " + SECRET]
    assert "".join(stored) + masker.flush() == "x " + MASK
    assert all("Sup3r" not in piece for piece in stored)


def test_its_json_form_is_masked_too():
    printed = json.dumps({"token": SECRET})
    assert fed(Masker([SECRET]), [printed[:10], printed[10:]]) == '{"token": "***"}'


def test_other_text_passes_at_once_and_unchanged():
    masker = Masker([SECRET, "another-secret"])
    assert masker.feed("plain line\n") == "plain line\n"
    assert masker.feed("ends with Sup") == "ends with "  # maybe a secret's start: held
    assert masker.feed("per\n") == "Supper\n"


def test_short_values_and_no_secrets_mask_nothing():
    assert fed(Masker(["yes", ""]), ["yes it is\n"]) == "yes it is\n"
    assert fed(Masker([]), ["anything"]) == "anything"


# Encoded forms ----------------------------------------------------------------------------

ENCODED = 'Sup3r s3cret/"Valu3"+&x'  # a space, a slash, quotes, + and &: every encoder differs


def readable(text: str, secret: str, window: int = 5) -> list[str]:
    """Pieces of `secret` (`window` bytes) that can be read back from any base64 run in
    `text`, at any of its four alignments: what a reader of the log could decode."""
    raw = secret.encode()
    pieces = {raw[i : i + window] for i in range(len(raw) - window + 1)}
    found = []
    for run in re.findall(r"[A-Za-z0-9+/_-]{4,}", text):
        run = run.translate(str.maketrans("-_", "+/"))
        for start in range(4):
            part = run[start:]
            part = part[: len(part) - len(part) % 4]
            decoded = base64.b64decode(part) if part else b""
            found += [piece.decode() for piece in pieces if piece in decoded]
    return found


def test_base64_of_a_secret_is_masked_wherever_it_starts_and_wherever_the_output_is_cut():
    for before in ("", "a", "ab", "abc", "abcd"):
        for after in ("", "z", "tail of it"):
            for alphabet in (base64.b64encode, base64.urlsafe_b64encode):
                printed = alphabet(f"{before}{ENCODED}{after}".encode()).decode()
                assert readable(printed, ENCODED)  # the check itself reads it unmasked
                for cut in range(0, len(printed) + 1, 5):
                    out = fed(Masker([ENCODED]), [printed[:cut], printed[cut:] + "\n"])
                    assert MASK in out and not readable(out, ENCODED), (before, after, cut, out)


def test_url_encoded_forms_are_masked_in_either_case_with_plus_or_percent_for_spaces():
    forms = {
        quote(ENCODED, safe=""),  # curl --data-urlencode, jq @uri
        quote(ENCODED),  # Python's default: / left as is
        quote_plus(ENCODED),  # a form's field: + for a space
        re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quote(ENCODED, safe="")),
        re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quote_plus(ENCODED)),
    }
    assert len(forms) == 5
    for form in forms:
        printed = f"GET /login?user=ops&token={form}&next=/ HTTP/1.1\n"
        for cut in range(len(printed) + 1):
            out = fed(Masker([ENCODED]), [printed[:cut], printed[cut:]])
            assert out == f"GET /login?user=ops&token={MASK}&next=/ HTTP/1.1\n", (form, cut)


def test_basic_credentials_are_masked_whole_wherever_the_output_is_cut():
    for user in ("u", "ops", "user", "someone"):  # each alignment of the secret in them
        credentials = base64.b64encode(f"{user}:{ENCODED}".encode()).decode()
        printed = f"> GET / HTTP/1.1\r\n> Authorization: Basic {credentials}\r\n> Accept: */*\r\n"
        for cut in range(len(printed) + 1):
            for second in range(cut, len(printed) + 1, 7):
                out = fed(Masker([ENCODED]), [printed[:cut], printed[cut:second], printed[second:]])
                assert out == f"> GET / HTTP/1.1\r\n> Authorization: Basic {MASK}\r\n> Accept: */*\r\n"


def test_basic_credentials_are_masked_even_of_a_password_it_was_not_given():
    credentials = base64.b64encode(b"admin:hunter2").decode()
    assert fed(Masker([]), [f"Authorization: basic {credentials}\n"]) == f"Authorization: basic {MASK}\n"
    # The word in a sentence is not credentials.
    for text in ("Basic usage: ni get\n", "basic auth is off\n", "BASIC\n"):
        assert fed(Masker([]), [text[:3], text[3:]]) == text


def test_a_long_secrets_base64_broken_into_lines_is_masked_line_by_line():
    key = "-----BEGIN KEY-----\n" + "k3y-m4terial/" * 20 + "\n-----END KEY-----\n"
    for width in (76, 64):  # base64's and openssl's lines
        whole = base64.b64encode(key.encode()).decode()
        printed = "\n".join(whole[i : i + width] for i in range(0, len(whole), width)) + "\n"
        out = fed(Masker([key]), [printed[:100], printed[100:]])
        assert not readable(out, key), out
        assert set(out.split("\n")) <= {MASK, ""}, out


def test_masking_keeps_up_with_a_long_secret_among_many():
    # A key of a few KiB has variants of a few KiB each: looking for one's start must not
    # cost a comparison per character and variant (a MiB of output took 20 s that way).
    key = "-----BEGIN KEY-----\n" + "\n".join(f"line-{i:03d}-" + "Qm9ndXM" * 9 for i in range(50)) + "\n"
    masker = Masker([key, *(f"token-{i}-abcdefghij" for i in range(20))])
    chunk = "an ordinary line of output, nothing secret in it at all " * 73
    started = time.perf_counter()
    for _ in range(256):  # a MiB, as the sandbox reads it
        assert masker.feed(chunk) == chunk
    assert time.perf_counter() - started < 5
