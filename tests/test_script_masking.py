"""The log's masking on its own: a secret is masked wherever the output is cut, in its JSON
form too, and nothing but secrets is held back or changed."""

import json

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
