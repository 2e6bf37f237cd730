"""Fetch real tokenizer vocabularies (no weights) for the optional `realvocab` tests.

The PyPI source distribution of llama-cpp-python ships vocab-only GGUF files of popular
families; transformers reads them (with the `gguf` package) and we save each as a plain
tokenizer directory. Vocabularies keep their upstream models' licences.

    python -m lab.scripts.fetch_real_vocabs [DEST]   # default: ~/.cache/llm-ensembling/vocabs
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

FAMILIES = ("gpt-2", "llama-bpe", "llama-spm", "phi-3", "qwen2")
DEFAULT = Path.home() / ".cache" / "llm-ensembling" / "vocabs"


def main(dest: Path = DEFAULT) -> None:
    from transformers import AutoTokenizer

    missing = [f for f in FAMILIES if not (dest / f / "tokenizer.json").is_file()]
    if not missing:
        print(f"real vocabularies already in {dest}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                "llama-cpp-python==0.3.36",
                "-d",
                tmp,
            ],
            check=True,
        )
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                name = Path(member.name).name
                if any(name == f"ggml-vocab-{f}.gguf" for f in missing):
                    member.name = name
                    archive.extract(member, tmp, filter="data")
        for family in missing:
            tokenizer = AutoTokenizer.from_pretrained(tmp, gguf_file=f"ggml-vocab-{family}.gguf")
            tokenizer.save_pretrained(dest / family)
            print(f"saved {family} ({len(tokenizer)} tokens) to {dest / family}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
