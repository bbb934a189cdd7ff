"""Next-character prediction on real English text, one device per passage: a sequence task on token ids.

Data: the text of the Python Language Reference's topics that every CPython installation ships for ``help()``
(``pydoc_data.topics``: 79 topics, about 465,000 characters of English technical prose), so the task runs
offline with nothing to download. Each topic is cut into passages of about :data:`PASSAGE` characters (at line
breaks); a device owns one passage, its own text, as a phone holds its owner's messages (the natural partition,
a few hundred devices of different sizes). A tenth of the passages (seeded) are the test set.

Inputs: windows of :data:`WINDOW` character ids (int64 token ids) taken every :data:`STRIDE` characters; target:
the id of the character that follows. Vocabulary: newline, the 95 printable ASCII characters and one id for
anything else (97 ids). Model: an embedding and a GRU, whose last state predicts the next character.

Run it (from the repository root)::

    .venv/bin/python jobs/pt_job_fedavg.py --task examples/text_task.py --device-selection-size 20 \\
        --local-iterations 20 --batch-size 32 --optimizer adam --lr 0.003 --num-rounds 30
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

WINDOW = 32
STRIDE = 4
PASSAGE = 2000
TEST_FRACTION = 0.1
SPLIT_SEED = 0
VOCAB = ["\n"] + [chr(c) for c in range(32, 127)] + ["<other>"]


def _ids(text: str) -> np.ndarray:
    """Character ids (int64) of ``text``; characters outside :data:`VOCAB` get the last id."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    ids = np.where((codes >= 32) & (codes < 127), codes - 31, len(VOCAB) - 1)
    return np.where(codes == 10, 0, ids)


def _passages() -> list[str]:
    from pydoc_data.topics import topics

    passages = []
    for name in sorted(topics):
        current = ""
        for line in topics[name].splitlines(keepends=True):
            current += line
            if len(current) >= PASSAGE:
                passages.append(current)
                current = ""
        if len(current) > WINDOW:
            passages.append(current)
    return passages


def data() -> dict:
    passages = _passages()
    rng = np.random.default_rng(SPLIT_SEED)
    test = set(rng.choice(len(passages), size=round(TEST_FRACTION * len(passages)), replace=False).tolist())
    splits: dict[bool, tuple[list, list, list]] = {True: ([], [], []), False: ([], [], [])}
    for owner, passage in enumerate(passages):
        ids = _ids(passage)
        starts = np.arange(0, len(ids) - WINDOW, STRIDE)
        windows = ids[starts[:, None] + np.arange(WINDOW)]
        x, y, owners = splits[owner not in test]
        x.append(windows)
        y.append(ids[starts + WINDOW])
        owners.append(np.full(len(starts), owner, dtype=np.int64))
    (x_train, y_train, owner_train), (x_test, y_test, _) = (
        [np.concatenate(part) for part in splits[True]],
        [np.concatenate(part) for part in splits[False]],
    )
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test, "owner_train": owner_train}


class CharGRU(nn.Module):
    """Embedding(97, 32) -> GRU(32 -> 128) -> Linear(128 -> 97) on the last step: ids (B, T) -> logits (B, 97)."""

    def __init__(self, vocab: int = len(VOCAB), embedding: int = 32, hidden: int = 128):
        super().__init__()
        self.embed = nn.Embedding(vocab, embedding)
        self.gru = nn.GRU(embedding, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        states, _ = self.gru(self.embed(ids))
        return self.out(states[:, -1])


def model() -> nn.Module:
    return CharGRU()


def metrics(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Accuracy, top-5 accuracy and perplexity (exp of the mean cross-entropy, in characters)."""
    top5 = outputs.topk(5, dim=1).indices
    return {
        "accuracy": float((outputs.argmax(dim=1) == targets).float().mean()),
        "top5_accuracy": float((top5 == targets[:, None]).any(dim=1).float().mean()),
        "perplexity": float(torch.nn.functional.cross_entropy(outputs, targets).exp()),
    }
