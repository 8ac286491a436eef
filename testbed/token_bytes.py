"""Token bytes: what bytes each token id stands for, for any byte-level or byte-fallback tokenizer.

Sharing happens on text (DESIGN.md §4.2), and the alignment of two tokenizations is a walk over byte offsets
(§4.3), so every tokenizer is read as a table from token id to bytes. Byte-level BPE vocabularies (Qwen2,
Llama-3) spell bytes with GPT-2's printable alphabet; metaspace vocabularies with byte fallback (Mistral,
SentencePiece) spell a space as U+2581 and unknown bytes as `<0xAB>`. Special tokens stand for no bytes: they are
mapped explicitly, never aligned as text. A tokenizer whose encodings are not exactly their text's bytes (one that
adds a prefix space) is refused where its table is built (`check_round_trip`).
"""

from __future__ import annotations

from functools import lru_cache

from tokenizers import decoders

METASPACE = "\u2581"


def is_byte_token(piece: str, byte_fallback: bool) -> bool:
    """A token of the byte alphabet: `<0xAB>` with byte fallback, else one of byte-level BPE's 256 characters."""
    if byte_fallback:
        return len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")
    return piece in _byte_decoder()


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's byte-to-unicode table, used by byte-level BPE vocabularies."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), 256)))
    chars, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def is_byte_level(tokenizer) -> bool:
    """Byte-level BPE (Qwen, Llama-3); else a metaspace vocabulary with byte fallback (Mistral, SentencePiece)."""
    return isinstance(tokenizer.backend_tokenizer.decoder, decoders.ByteLevel)


def token_bytes_table(tokenizer) -> list[bytes]:
    """The bytes each token id stands for; special tokens stand for none (they are mapped, never aligned).

    In a metaspace vocabulary '\u2581' inside a piece is the tokenizer's own space marker and stands for b' ';
    a literal U+2581 of the text is spelled with byte-fallback tokens instead (`encode_text`)."""
    if not getattr(tokenizer, "is_fast", False):   # a Python tokenizer has no backend whose decoder says which
        raise ValueError(f"{type(tokenizer).__name__} is not a fast tokenizer, whose vocabulary and decoder the "
                         "byte alignment reads: give the policy a model folder with a tokenizer.json (transformers "
                         "builds a fast tokenizer from it)")
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    byte_level = is_byte_level(tokenizer)
    table = []
    decoder = _byte_decoder()
    for i, piece in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        if i in special or piece is None:
            table.append(b"")
        elif byte_level:
            table.append(bytes(decoder[c] for c in piece))
        elif is_byte_token(piece, byte_fallback=True):
            table.append(bytes([int(piece[3:5], 16)]))
        else:
            table.append(piece.replace(METASPACE, " ").encode())
    check_round_trip(tokenizer, table)
    return table


ROUND_TRIP_PROBE = "12 + 30 = 42\n42 - 5 = 37"
"""text every task spells, no leading space: its encoding's bytes must be exactly its own"""


def check_round_trip(tokenizer, table: list[bytes]) -> None:
    """Refuses a tokenizer whose encodings do not stand for exactly their text's bytes, which the alignment reads
    them as: one that adds a leading space (the hub's SentencePiece conversions: Mistral, Llama-2) would shift
    offsets by a byte and pass for boundary drift."""
    text = ROUND_TRIP_PROBE.encode()
    data = b"".join(table[i] for i in encode_text(tokenizer, ROUND_TRIP_PROBE))
    if data == text:
        return
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    if len(data) > len(text) and data.replace(b" ", b"") == text.replace(b" ", b""):
        why = f"it adds a leading space (to the text or to each of its pieces). {prefix_space_fix(tokenizer)}"
    else:
        why = ("its vocabulary is read as neither byte-level BPE nor metaspace with byte fallback, the two kinds the "
               "alignment supports")
    raise ValueError(f"{name} encodes {ROUND_TRIP_PROBE!r} as {data!r}, not its bytes: {why}")


GENERIC_TOKENIZERS = {"PreTrainedTokenizerFast", "TokenizersBackend"}
"""transformers' classes that take tokenizer.json as written (the second is what the first is called since 5.0)"""


def prefix_space_fix(tokenizer) -> str:
    """Where to switch a prefix space off. transformers builds a model's own tokenizer class (LlamaTokenizer,
    Qwen2Tokenizer) from tokenizer_config.json's settings, taking only the vocabulary from tokenizer.json; a generic
    one is tokenizer.json as written."""
    where = ("in the model folder's tokenizer.json: a Metaspace pre_tokenizer's \"prepend_scheme\" to \"never\", a "
             "\"Prepend\" normalizer removed, a ByteLevel pre_tokenizer's \"add_prefix_space\" to false"
             if type(tokenizer).__name__ in GENERIC_TOKENIZERS else
             f"with \"add_prefix_space\": false in the model folder's tokenizer_config.json (transformers builds a "
             f"{type(tokenizer).__name__} from that file's settings)")
    return f"Switch it off {where}, and pass the folder with --model-paths NAME=DIR"


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of `text` as text: marker text such as '<|eot_id|>' in it is encoded as characters, never as the
    special token (specials are mapped explicitly, DESIGN.md §6), and the ids' bytes (`token_bytes_table`) are the
    text's bytes.

    A metaspace tokenizer reads a literal U+2581 as its space marker, so 'a\u2581b' would come back as 'a b';
    there the literal character is spelled with the byte-fallback tokens of its UTF-8 bytes. A vocabulary without
    those tokens cannot spell it, and the text is refused rather than changed."""
    def encode(part: str) -> list[int]:
        return tokenizer(part, add_special_tokens=False, split_special_tokens=True)["input_ids"] if part else []

    if is_byte_level(tokenizer) or METASPACE not in text:
        return encode(text)
    spelled = [tokenizer.convert_tokens_to_ids(f"<0x{b:02X}>") for b in METASPACE.encode()]
    if any(i is None or i == tokenizer.unk_token_id for i in spelled):
        raise ValueError("this metaspace tokenizer has no byte-fallback tokens to spell a literal U+2581 in the text")
    parts = [encode(part) for part in text.split(METASPACE)]
    return [i for k, part in enumerate(parts) for i in (spelled if k else []) + part]


def byte_offsets(ids: list[int], table: list[bytes]) -> list[tuple[int, int]]:
    """Byte span [start, end) of each token in the concatenation of the tokens' bytes."""
    spans, pos = [], 0
    for i in ids:
        spans.append((pos, pos + len(table[i])))
        pos += len(table[i])
    return spans
