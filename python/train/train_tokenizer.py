"""Trains the byte-level BPE tokenizer (vocabulary 4096) on the training split and writes it to
xkernels/models/weights/tokenizer.json.

    python python/train/train_tokenizer.py
"""

import random
import time
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from xkernels import data

VOCAB = 4096
OUT = Path(__file__).resolve().parents[2] / "xkernels" / "models" / "weights" / "tokenizer.json"


def main():
    began = time.time()
    docs = data.corpus("train")
    random.Random(0).shuffle(docs)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[data.EOT, data.MASK],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=True)
    tokenizer.train_from_iterator(docs, trainer=trainer)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(OUT))
    sample = data.held_out_prompts("math", 1)[0]
    print(f"vocabulary {tokenizer.get_vocab_size()}, {time.time() - began:.0f} s; "
          f"{len(sample)} chars of a held-out prompt -> {len(tokenizer.encode(sample).ids)} tokens")


if __name__ == "__main__":
    main()
