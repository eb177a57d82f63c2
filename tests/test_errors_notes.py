"""Exception notes from ``@catalogued`` and the Python API (lookup, get, explain)."""

import pytest
import torch

import errors
from attn_ref import flash_attn_with_kvcache
from errors.catalog import DOCS_URL_ENV
from errors.notes import ENV_VAR, catalogued


def _q_none_error():
    cache = torch.zeros(1, 4, 1, 8)
    with pytest.raises(ValueError) as info:
        flash_attn_with_kvcache(q=None, k_cache=cache, v_cache=cache)
    return info.value


def test_note_names_the_offline_command_and_the_docs_url_and_message_is_unchanged(monkeypatch):
    monkeypatch.delenv(DOCS_URL_ENV, raising=False)
    exc = _q_none_error()
    entry = errors.get("only-qv/q-none-without-only-qv")
    assert str(exc) == "q can only be None when only_qv=True"
    assert exc.__notes__ == [
        f"attn-ref error {entry['id']}: {entry['slug']}; run `python -m errors explain "
        f"{entry['id']}` or see {entry['docs_url']}"
    ]
    assert (
        entry["docs_url"]
        == "https://attn-ref.github.io/attn-ref/errors/only-qv/q-none-without-only-qv/"
    )
    assert errors.lookup(exc.__notes__[0]) is entry  # the note pasted back finds its entry


@pytest.mark.parametrize(
    "setting, link",
    [
        ("http://localhost:8000/attn-ref/", "http://localhost:8000/attn-ref/errors/"),
        ("file:///opt/site", "file:///opt/site/errors/"),
        ("", None),
    ],
)
def test_docs_url_of_the_note_is_configurable(monkeypatch, setting, link):
    monkeypatch.setenv(DOCS_URL_ENV, setting)
    entry = errors.get("only-qv/q-none-without-only-qv")
    (note,) = _q_none_error().__notes__
    command = f"run `python -m errors explain {entry['id']}`"
    assert note.endswith(f"{command} or see {link}{entry['slug']}/" if link else command)
    header = errors.explain(entry["id"]).splitlines()[2]
    assert (f"{link}{entry['slug']}/" in header) if link else ("http" not in header)
    # the stored field keeps the published site
    assert entry["docs_url"].startswith("https://attn-ref.github.io/")


def test_environment_variable_turns_notes_off(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "0")
    assert not hasattr(_q_none_error(), "__notes__")


def test_errors_not_raised_by_the_package_get_no_note_and_notes_are_not_repeated():
    @catalogued
    def user_code():
        # same text, but not the package's raise
        raise ValueError("q can only be None when only_qv=True")

    with pytest.raises(ValueError) as info:
        user_code()
    assert not hasattr(info.value, "__notes__")

    @catalogued
    def outer():
        return flash_attn_with_kvcache(
            q=None, k_cache=torch.zeros(1, 4, 1, 8), v_cache=torch.zeros(1, 4, 1, 8)
        )

    with pytest.raises(ValueError) as info:
        outer()
    assert len(info.value.__notes__) == 1


def test_lookup_get_explain():
    exc = _q_none_error()
    entry = errors.lookup(exc)
    assert entry["slug"] == "only-qv/q-none-without-only-qv"
    assert errors.lookup(str(exc)) is entry
    assert errors.get(entry["id"]) is entry
    assert errors.lookup("a message nobody raises") is None
    assert errors.explain(exc).startswith(f"# {entry['slug']}")
    with pytest.raises(KeyError):
        errors.get("no/such-slug")
    with pytest.raises(KeyError):
        errors.explain("a message nobody raises")


def test_lookup_tells_identical_messages_apart_by_raise_location():
    with pytest.raises(TypeError) as info:
        flash_attn_with_kvcache([1.0], torch.zeros(1, 4, 1, 8), torch.zeros(1, 4, 1, 8))
    assert errors.lookup(info.value)["slug"] == "arguments/not-a-tensor"
    from attn_ref.sequence_parallel import ring_attention

    with pytest.raises(TypeError) as info:
        ring_attention([1.0], torch.zeros(1, 4, 1, 8), torch.zeros(1, 4, 1, 8))
    assert str(info.value) == "q must be a torch.Tensor, got list"
    assert errors.lookup(info.value)["slug"] == "sequence-parallel/not-a-tensor"
