"""Builders for the data tests: a small real Hugging Face tokenizer, and data files in every format.

The tokenizer is a byte-level BPE trained in the test on a few sentences, wrapped in
PreTrainedTokenizerFast with a ChatML-style chat template and saved with save_pretrained, so the
runtime loads it through AutoTokenizer like any checkpoint's tokenizer. The Arrow directory is
written with pyarrow in the layout that datasets' save_to_disk uses (IPC stream files named in
state.json, next to dataset_info.json), since `datasets` is not a dependency.
"""

from __future__ import annotations

import json
from pathlib import Path

CHATML = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SENTENCES = [
    "What is the capital of France? The capital of France is Paris.",
    "Name a colour of the sky. The sky is blue on a clear day.",
    "How many legs does a spider have? A spider has eight legs.",
    "You are a helpful assistant. Answer briefly and politely.",
]


def build_hf_tokenizer(directory: Path) -> str:
    """Train a ~300-token BPE, give it a chat template, save it; returns the directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<unk>", "<pad>", "<s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(SENTENCES * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="<|im_end|>", pad_token="<pad>",
        unk_token="<unk>", additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML
    fast.padding_side = "right"  # the runtime sets left; proves it does not depend on the saved side
    fast.save_pretrained(directory)
    return str(directory)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_arrow_dir(directory: Path, rows: list[dict], shards: int = 2) -> Path:
    """A save_to_disk-style dataset directory of `shards` Arrow stream files."""
    import pyarrow as pa

    directory.mkdir(parents=True)
    table = pa.Table.from_pylist(rows)
    names, step = [], -(-len(rows) // shards)
    for k in range(shards):
        name = f"data-{k:05d}-of-{shards:05d}.arrow"
        with pa.OSFile(str(directory / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table.slice(k * step, step))
        names.append({"filename": name})
    (directory / "state.json").write_text(json.dumps({"_data_files": names, "_split": None}))
    (directory / "dataset_info.json").write_text(json.dumps({"features": {}}))
    return directory


def write(fmt: str, base: Path, rows: list[dict]) -> Path:
    """`rows` as a data source of format `fmt` under `base`."""
    if fmt == "jsonl":
        return write_jsonl(base / "data.jsonl", rows)
    if fmt == "parquet":
        return write_parquet(base / "data.parquet", rows)
    return write_arrow_dir(base / "data", rows)
