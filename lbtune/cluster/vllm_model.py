"""Build the tiny random-weight Llama that the real-vLLM preset and tests serve.

Run inside the vLLM virtualenv (it needs ``torch``, ``transformers`` and ``tokenizers``,
which lbtune's own venv does not), by path, so that lbtune need not be installed there::

    .venv-vllm/bin/python lbtune/cluster/vllm_model.py OUT_DIR TEXT_FILE [TEXT_FILE ...]

It trains a byte-level BPE of :data:`VOCAB_SIZE` tokens on the given local text files
(:mod:`lbtune.cluster.vllm` passes the package's ``data/tokenizer/corpus.txt``, a frozen
snapshot of lbtune's README and some docs, found through importlib.resources), wraps
it as a ``PreTrainedTokenizerFast`` with a chat template (the simulator's:
``<|role|>\\ncontent\\n`` per message, then ``<|assistant|>\\n``), makes a random-weight
``LlamaConfig`` model (hidden 128, intermediate 256, 2 layers, 4 heads of 32, 2 KV heads:
vLLM's CPU attention needs a head size of 32..512) and ``save_pretrained``s both into
``OUT_DIR``. No model hub is reached (``HF_HUB_OFFLINE=1``). The weights are seeded: the same
text gives the same model. A file ``lbtune-model.json`` written last marks a finished build.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

VOCAB_SIZE = 4096
MAX_POSITIONS = 4096
DONE_MARKER = "lbtune-model.json"
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
ARCH = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def build(out: Path, texts: list[Path]) -> None:
    """Train the tokenizer, make the model, save both into ``out``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    files = [str(p) for p in texts if p.is_file()]
    if not files:
        raise SystemExit(f"no text to train a tokenizer on: {', '.join(map(str, texts))}")
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train(files, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=MAX_POSITIONS,
    )
    tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        **ARCH,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    model.save_pretrained(str(out))
    marker = {"vocab_size": len(tok), "max_positions": MAX_POSITIONS, "texts": files, **ARCH}
    (out / DONE_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    out = Path(argv[0])
    texts = [Path(a) for a in argv[1:]]
    build(out, texts)
    print(f"tiny model in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
