"""A model out: the trained actor as a Hugging Face model directory a user can serve.

What a directory holds: config.json, the weights as safetensors (split into shards of at most
MAX_SHARD_SIZE, with model.safetensors.index.json, when the model is larger), generation_config.json
with the tokenizer's bos/eos/pad ids, the tokenizer's files (data/tokenizer_export.py: rlkube's
byte tokenizer is written as an equivalent transformers tokenizer), and rlkube-export.json (the
step, the checkpoint it came from). `AutoModelForCausalLM.from_pretrained(dir)` and
`AutoTokenizer.from_pretrained(dir)` read it back.

Two ways to one:
- during training (`Exporter`, called by the step loop after the checkpoint decision): at the last
  step, and every `export.everySteps` when set. The actor's ranks consolidate its FSDP shards with
  `get_model_state_dict(full_state_dict=True, cpu_offload=True)` (a collective over the actor's
  group; only rank 0 ends up holding the full tensors, in host memory) and rank 0 writes. Ranks
  without the actor take no part. A run stopped by SIGTERM exports nothing: its checkpoint can be
  exported later.
- from any committed checkpoint (`export_checkpoint`, the `export` verb): one process on CPU reads
  only the actor's model tensors from the DCP shards (not the optimizer state), whatever the
  number of ranks that wrote them.

A LoRA actor's export (during training) holds its adapter in PEFT's format in `<dir>/adapter`
(adapter_config.json, adapter_model.safetensors, the tokenizer), written by engine/lora.py's
save_adapter from a host model rebuilt from the consolidated state, for
`PeftModel.from_pretrained(base, dir/adapter)`; with `export.mergeLora` `<dir>` itself is also the
plain model with the adapters folded in. /progress names them outputs.adapter and outputs.model.
`export_checkpoint` of a LoRA checkpoint does the same from the LoRA settings the checkpoint
records (`merge`: the `--merge-lora` flag); a checkpoint that records only the adapters' scale
(written before the settings were recorded) can only be folded in, and is.

Both need the model's architecture, which a checkpoint records in its metadata (`model_meta`: the
HF config, the tokenizer, where the actor's tensors sit in the checkpoint's state).

Atomic: a directory is written under a hidden temp name next to its destination and renamed into
place; an earlier export there is first renamed aside and removed after, so a reader finds the
old model or the new one, complete, and at worst (a crash between the two renames) none, with the
old one still beside it under `.<name>.old-<pid>`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch

from rlkube.runtime.contract import progress as report
from rlkube.runtime.contract.config import LoraSpec, ModelSpec, RuntimeConfig
from rlkube.runtime.infra.checkpoint import META, STEP_DIR, committed, read_meta
from rlkube.runtime.infra.errors import ConfigError
from rlkube.runtime.infra.log import emit, log

EXPORT_META = "rlkube-export.json"
MAX_SHARD_SIZE = "5GB"  # safetensors shards of at most this size (transformers' usual cap)
ADAPTER_DIR = "adapter"  # a LoRA run's adapter, inside the export directory
MODEL_PREFIX = "lm."  # the HF model is `.lm` of the trained wrapper (SequenceLogprobs, PolicyModel)


def model_meta(lm: torch.nn.Module, spec: ModelSpec, prefix: str) -> dict:
    """What a checkpoint records so that its actor can be exported without the run's config:
    the HF config, the tokenizer, the name prefix of the actor's wrapper in the saved state, and,
    when the actor trains adapters, the LoRA settings (for PEFT's adapter_config.json), their scale
    (alpha / rank) and the base model's path (the adapter's base_model_name_or_path)."""
    lora = getattr(spec, "lora", None)
    return {"hfConfig": lm.config.to_dict(), "tokenizer": spec.tokenizer, "prefix": prefix,
            "loraScale": lora.alpha / lora.rank if lora is not None else None,
            "lora": lora.model_dump(mode="json", by_alias=True) if lora is not None else None,
            "basePath": spec.path if lora is not None else None}


def merge_lora(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A LoRA model's state (PEFT's names: `x.base_layer.weight`, `x.lora_A.<adapter>.weight`,
    `x.lora_B.<adapter>.weight`) as the plain model's, each adapter folded into its weight:
    W + scale * B @ A, computed in fp32 and stored in W's dtype. A state without adapters is
    returned as it is."""
    if not any(".base_layer." in key for key in state):
        return state
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if ".lora_A." in key or ".lora_B." in key:
            continue
        module, base, leaf = key.partition(".base_layer.")
        if base and leaf == "weight":
            down = [v for k, v in state.items() if k.startswith(f"{module}.lora_A.")]
            up = [v for k, v in state.items() if k.startswith(f"{module}.lora_B.")]
            for a, b in zip(down, up, strict=True):
                value = (value.float() + scale * (b.float() @ a.float())).to(value.dtype)
        out[f"{module}.{leaf}" if base else key] = value
    return out


def default_dir(config: RuntimeConfig) -> Path:
    return Path(config.export.dir) if config.export.dir else Path(config.checkpoint.dir) / "export"


# -- writing a directory ----------------------------------------------------------------------


def _special_ids(tokenizer_name: str) -> dict[str, int]:
    from rlkube.runtime.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_name)
    return {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}


def build_hf_model(hf_config: dict, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """An HF causal LM whose parameters are `state`'s tensors themselves (no copy)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(hf_config)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.use_cache = True  # the trainer turns the KV cache off; serving wants it
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    result = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    on_meta = [n for n, p in model.named_parameters() if p.is_meta]
    if result.unexpected_keys or on_meta:
        raise ValueError(f"export: the state does not fit {config.model_type}: unexpected "
                         f"{result.unexpected_keys[:5]}, missing {on_meta[:5]}")
    dtypes = {p.dtype for p in model.parameters()}
    if len(dtypes) == 1:
        model.config.dtype = dtypes.pop()
    return model


def _write_model_files(hf_config: dict, state: dict[str, torch.Tensor], tokenizer: str, out: Path,
                       info: dict) -> None:
    """The HF model directory of `state` (HF names, full tensors on CPU), written into `out`."""
    from rlkube.runtime.data.tokenizer_export import save_tokenizer

    model = build_hf_model(hf_config, state)
    for key, value in _special_ids(tokenizer).items():
        setattr(model.config, key, value)
        setattr(model.generation_config, key, value)
    model.save_pretrained(str(out), max_shard_size=MAX_SHARD_SIZE)
    save_tokenizer(tokenizer, out)
    _write_meta(out, info, tokenizer)


def _write_meta(out: Path, info: dict, tokenizer: str, fmt: str = "huggingface") -> None:
    meta = {**info, "format": fmt, "tokenizer": tokenizer, "time": time.time()}
    (out / EXPORT_META).write_text(json.dumps(meta, indent=1))


def _write_atomically(dest: Path, fill) -> Path:
    """`fill(tmp)` writes a directory under a temp name next to `dest`; it then replaces `dest`."""
    t0 = time.perf_counter()
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(dest)
    tmp = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    try:
        tmp.mkdir()
        fill(tmp)
        _fsync_tree(tmp)
        _publish(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("exported %s in %.2fs", dest, time.perf_counter() - t0)
    return dest


def write_model_dir(hf_config: dict, state: dict[str, torch.Tensor], tokenizer: str, dest: Path,
                    info: dict) -> Path:
    """Write the HF directory of `state` (HF names, full tensors on CPU) to `dest`, atomically."""
    return _write_atomically(dest, lambda tmp: _write_model_files(hf_config, state, tokenizer, tmp, info))


def lora_host_model(hf_config: dict, state: dict[str, torch.Tensor], lora: LoraSpec, base_path: str | None):
    """A PeftModel on the host whose tensors are `state`'s (PEFT's names, adapters unmerged): the
    model's own architecture with `lora`'s adapters injected, as the trainer built it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlkube.runtime.engine.lora import add_lora

    fields = dict(hf_config)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config)
    peft_model = add_lora(lm, lora)
    lm.load_state_dict(state, strict=False, assign=True)
    lm.tie_weights()
    on_meta = [n for n, p in lm.named_parameters() if p.is_meta]
    if on_meta:
        raise ValueError(f"export: the state lacks LoRA model tensors {on_meta[:5]}")
    # from_pretrained of the adapter finds its base here; a model built from a config has none
    peft_model.peft_config["default"].base_model_name_or_path = base_path
    return peft_model


def write_lora_dir(hf_config: dict, state: dict[str, torch.Tensor], lora: LoraSpec, tokenizer: str,
                   base_path: str | None, dest: Path, info: dict, merge: bool) -> Path:
    """A LoRA actor's export to `dest`, atomically: the adapter in PEFT's format (adapter_config.json,
    adapter_model.safetensors) with the tokenizer in `dest/adapter`, and with `merge` the model with
    the adapters folded into its weights in `dest` itself. `base_path`: the base model's directory
    (None for a model built from a config), recorded in the adapter's config."""
    from rlkube.runtime.data.tokenizer_export import save_tokenizer
    from rlkube.runtime.engine.lora import save_adapter

    def fill(tmp: Path) -> None:
        if merge:
            _write_model_files(hf_config, merge_lora(state, lora.alpha / lora.rank), tokenizer, tmp, info)
        else:
            _write_meta(tmp, info, tokenizer, fmt="peft-lora")
        adapter = tmp / ADAPTER_DIR
        save_adapter(lora_host_model(hf_config, state, lora, base_path), adapter)
        save_tokenizer(tokenizer, adapter)
        _write_meta(adapter, info, tokenizer, fmt="peft-lora")

    return _write_atomically(dest, fill)


def _remove_leftovers(dest: Path) -> None:
    """Temp and set-aside directories of exports to `dest` that died half-way."""
    for p in dest.parent.glob(f".{dest.name}.partial-*"):
        shutil.rmtree(p, ignore_errors=True)
    if dest.exists():
        for p in dest.parent.glob(f".{dest.name}.old-*"):
            shutil.rmtree(p, ignore_errors=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Every file of a written directory, and the directory, on disk before it is published."""
    for p in [*root.iterdir(), root]:
        _fsync(p)


def _publish(tmp: Path, dest: Path) -> None:
    old = None
    if dest.exists():
        old = dest.parent / f".{dest.name}.old-{os.getpid()}"
        os.rename(dest, old)
    os.rename(tmp, dest)
    _fsync(dest.parent)  # the renames themselves
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# -- from a committed checkpoint ---------------------------------------------------------------


def resolve_checkpoint(source: Path) -> Path:
    """`source` itself when it is a committed checkpoint, else the latest committed one under it."""
    source = Path(source)
    if STEP_DIR.match(source.name) and (source / META).is_file():
        return source
    found = committed(source)
    if not found:
        raise ConfigError(f"{source}: not a committed checkpoint (step-NNNNNNNNN with {META}) and holds none")
    return found[-1][1]


def read_model_state(path: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The actor's HF tensors of checkpoint `path` (no optimizer state), on CPU, in one process."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(str(path))
    full = f"model.{prefix}{MODEL_PREFIX}"
    wanted = {}
    for key, item in reader.read_metadata().state_dict_metadata.items():
        if key.startswith(full) and isinstance(item, TensorStorageMetadata):
            wanted[key[len("model."):]] = torch.empty(item.size, dtype=item.properties.dtype)
    if not wanted:
        raise ConfigError(f"{path}: holds no model tensors under {full!r}")
    dcp.load({"model": wanted}, storage_reader=reader, no_dist=True)  # "a single process": checkpoint.py
    skip = len(prefix) + len(MODEL_PREFIX)
    return {key[skip:]: value for key, value in wanted.items()}


def export_checkpoint(source: Path, dest: Path, tokenizer: str | None = None, overwrite: bool = False,
                      merge: bool = False) -> dict:
    """Export the actor of checkpoint `source` (a step directory, or a checkpoint root: its latest)
    to `dest`; the export's record. A LoRA actor's adapter goes to `dest/adapter` and, with `merge`,
    the model with the adapters folded in to `dest`. ConfigError for what the user can fix."""
    path = resolve_checkpoint(source)
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()) and not overwrite:
        raise ConfigError(f"--to: {dest} exists and is not empty (pass --overwrite to replace it)")
    meta = read_meta(path)
    model = meta.get("model")
    if not model:
        raise ConfigError(f"{path}: its {META} records no model (written by an rlkube without export); "
                          "export it from the run instead")
    tok = tokenizer or model["tokenizer"]
    if tok != "byte" and not Path(tok).is_dir():
        raise ConfigError(f"--tokenizer: the run's tokenizer directory {tok!r} is not here; pass --tokenizer DIR")
    state = read_model_state(path, model["prefix"])
    info = {"step": int(meta["step"]), "checkpoint": str(path)}
    record = {"event": "export", "path": str(dest), **info}
    if model.get("lora") is not None:
        lora = LoraSpec.model_validate(model["lora"])
        write_lora_dir(model["hfConfig"], state, lora, tok, model.get("basePath"), dest, info, merge)
        record["adapterPath"] = str(dest / ADAPTER_DIR)
        if merge:
            record["modelPath"] = str(dest)
        return record
    if model.get("loraScale"):
        log.warning("export: %s records the adapters' scale but not their settings; writing the model with "
                    "the adapters folded in, and no adapter", path)
    elif merge:
        log.warning("export: --merge-lora ignored, %s holds no LoRA adapters; writing its model", path)
    write_model_dir(model["hfConfig"], merge_lora(state, model.get("loraScale") or 0.0), tok, dest, info)
    return {**record, "modelPath": str(dest)}


# -- during training ---------------------------------------------------------------------------


class Exporter:
    """Exports the actor at the last step and every `export.everySteps`; collective over the
    ranks holding the actor (the others return at once)."""

    def __init__(self, config: RuntimeConfig, is_main: bool) -> None:
        self.config = config
        self.is_main = is_main
        self.dest = default_dir(config)

    def due(self, step: int) -> bool:
        e = self.config.export
        return e.enabled and (step == self.config.training.steps or bool(e.every_steps and step % e.every_steps == 0))

    def __call__(self, step: int, wrapper: torch.nn.Module | None) -> dict | None:
        """Export after `step` steps when due; /progress fields of the export on rank 0, else None."""
        if wrapper is None or not self.due(step):
            return None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        t0 = time.perf_counter()
        with torch.no_grad():
            full = get_model_state_dict(wrapper, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.is_main:
            return None
        state = {key[len(MODEL_PREFIX):]: value for key, value in full.items()}
        return self.write(step, state, wrapper.lm.config.to_dict(), t0)

    def from_staged(self, step: int, model_state: dict, prefix: str, hf_config: dict) -> dict:
        """The export of `step` from a checkpoint's staged copy of the trained state (its "model"
        part: full tensors in host memory, named as in the checkpoint, the actor's under
        `prefix`), on this process alone: no second copy of the weights is gathered. Only for an
        actor that is not sharded (one rank holds every tensor); /progress fields as __call__'s."""
        t0 = time.perf_counter()
        head = f"{prefix}{MODEL_PREFIX}"
        state = {key[len(head):]: value for key, value in model_state.items() if key.startswith(head)}
        if not state:
            raise ValueError(f"export: the staged state holds no tensors under {head!r}")
        return self.write(step, state, hf_config, t0)

    def write(self, step: int, state: dict[str, torch.Tensor], hf_config: dict, t0: float) -> dict:
        """Write the export of `state` (HF names, full tensors on CPU) after `step` steps; its
        /progress fields (rank 0)."""
        spec = self.config.model
        outputs = {}
        if spec.lora is None:
            write_model_dir(hf_config, state, spec.tokenizer, self.dest, {"step": step})
        else:
            merge = self.config.export.merge_lora
            write_lora_dir(hf_config, state, spec.lora, spec.tokenizer, spec.path, self.dest, {"step": step}, merge)
            outputs[report.OUTPUT_ADAPTER] = {report.OUTPUT_PATH: str(self.dest / ADAPTER_DIR), report.OUTPUT_STEP: step}
        if spec.lora is None or self.config.export.merge_lora:
            outputs[report.OUTPUT_MODEL] = {report.OUTPUT_PATH: str(self.dest), report.OUTPUT_STEP: step}
        emit({"event": "export", "step": step, "path": str(self.dest), **{f"{k}Path": v[report.OUTPUT_PATH]
              for k, v in outputs.items()}, "seconds": round(time.perf_counter() - t0, 3)})
        return {report.OUTPUTS: outputs}
