"""The tokenizer files of an exported model: what `AutoTokenizer.from_pretrained(dir)` reads back.

A Hugging Face tokenizer (model.tokenizer is a directory) is loaded and saved again, which
writes its own files (tokenizer.json, tokenizer_config.json with the chat template, special
tokens). rlkube's byte tokenizer has no files of its own, so one is built that encodes exactly
as it does: a byte-level BPE with the 256 bytes as its whole vocabulary and no merges (so every
UTF-8 byte is one token with the byte's value as its id), then pad 256, bos 257, eos 258 as
special tokens. Encoding text with special tokens prepends bos, as rlkube does before every
prompt; the chat template writes `role: content` lines after a bos and ends with `assistant: `
when a generation prompt is asked for, which is the byte tokenizer's chat format.
"""

from __future__ import annotations

from pathlib import Path

from rlkube.runtime.data.tokenizer import ByteTokenizer

BYTE_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def byte_level_alphabet() -> list[str]:
    """The character that stands for each byte 0..255 in a byte-level BPE vocabulary.

    Bytes that are visible, non-space Latin-1 characters stand for themselves; the others
    (control bytes, space, and a few invisible ones) are moved to code points 256 and up, in
    byte order, so that every token is a printable string.
    """
    visible = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    out, shifted = [], 0
    for byte in range(256):
        if byte in visible:
            out.append(chr(byte))
        else:
            out.append(chr(256 + shifted))
            shifted += 1
    return out


def byte_tokenizer_hf(byte: ByteTokenizer | None = None):
    """A transformers fast tokenizer that encodes and decodes exactly as `ByteTokenizer`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    byte = byte or ByteTokenizer()
    vocab = {char: i for i, char in enumerate(byte_level_alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    specials = {byte.pad_id: "<pad>", byte.bos_id: "<s>", byte.eos_id: "</s>"}
    tok.add_special_tokens([AddedToken(specials[i], special=True) for i in sorted(specials)])
    for token_id, token in specials.items():
        if tok.token_to_id(token) != token_id:  # the ids are the contract with the trained model
            raise AssertionError(f"byte tokenizer export: {token} got id {tok.token_to_id(token)}, not {token_id}")
    bos = specials[byte.bos_id]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, byte.bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=specials[byte.pad_id], bos_token=bos, eos_token=specials[byte.eos_id],
        chat_template=BYTE_CHAT_TEMPLATE, padding_side="left", model_max_length=1 << 30,
    )


def save_tokenizer(name: str, dest: Path) -> None:
    """Write the files of tokenizer `name` ('byte' or a tokenizer directory) into `dest`."""
    if name == "byte":
        byte_tokenizer_hf().save_pretrained(str(dest))
        return
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(name, local_files_only=True).save_pretrained(str(dest))
