"""User text files that do not decode: the error names the file, the byte offset of the first byte that is not
UTF-8 and the encodings accepted, instead of Python's "'utf-8' codec can't decode byte 0xd7 in position 0", whose
position counts from the start of whichever buffer the reader was decoding, not from the start of the file.

Every file encoderlab reads from a user (fine-tuning tables, pretraining corpora, prediction inputs) is read as
UTF-8 (the fine-tuning and prediction readers drop a leading byte-order mark, which spreadsheets write).
"""

import codecs
import gzip
import itertools
from pathlib import Path

ACCEPTED_ENCODINGS = "UTF-8 (plain ASCII is UTF-8 too)"
UTF16_MARKS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
CHUNK_BYTES = 1 << 20


def open_bytes(path: Path):
    """The file's bytes, decompressed for ``.gz`` (as the readers see them)."""
    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")


def first_undecodable(path: str | Path) -> tuple[int, int] | None:
    """(byte offset, byte) of the first byte of `path` that does not decode as UTF-8 (offsets in the decompressed
    stream of a ``.gz``), or None when the whole file decodes."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    read = 0
    with open_bytes(Path(path)) as handle:
        for chunk in itertools.chain(iter(lambda: handle.read(CHUNK_BYTES), b""), [None]):
            pending = decoder.getstate()[0]  # the start of a character cut by the previous chunk's end
            try:
                decoder.decode(chunk or b"", final=chunk is None)  # final: the file may end inside a character
            except UnicodeDecodeError as error:
                return read - len(pending) + error.start, error.object[error.start]
            read += len(chunk or b"")
    return None


def decoding_error(path: str | Path) -> ValueError:
    """The one-line error for a file that is not UTF-8 (call it where a reader raised UnicodeDecodeError)."""
    path = Path(path)
    found = first_undecodable(path)
    where = (
        "it does not decode"
        if found is None
        else f"byte 0x{found[1]:02x} at byte offset {found[0]}"
        + (" of the decompressed stream" if path.suffix.lower() == ".gz" else "")
        + " does not decode"
    )
    with open_bytes(path) as handle:
        utf16 = handle.read(2) in UTF16_MARKS
    source = "UTF-16" if utf16 else "LATIN1"
    hint = " It starts with a UTF-16 byte-order mark (a spreadsheet's 'Unicode text' export)." if utf16 else ""
    return ValueError(
        f"{str(path)!r} is not UTF-8: {where}.{hint} Accepted: {ACCEPTED_ENCODINGS}; re-save it as "
        f"UTF-8 (e.g. iconv -f {source} -t UTF-8 FILE > NEW_FILE)"
    )


def read_text_file(path: str | Path) -> str:
    """The text of a UTF-8 file (a leading byte-order mark dropped); another encoding is a `decoding_error`."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise decoding_error(path) from None
