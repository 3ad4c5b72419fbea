"""The local embedder's vectors for texts longer than the model's 256-token window."""

from __future__ import annotations

import numpy as np

from responses_gateway.retrieval.embedder import local_embedder


def test_a_long_texts_windows_count_by_their_tokens() -> None:
    # "cat" is one WordPiece token: 254 of them fill the first window exactly ([CLS] … [SEP]), and
    # "dog" is the second window's only token. The text's vector is its tokens' mean, so a window of
    # 3 tokens ([CLS] dog [SEP]) moves it by about 3/259 of the way; weighing the two windows equally
    # would put it halfway between "cat…" and "dog".
    embedder = local_embedder()
    cats = "cat " * 254
    both, first, last = embedder.embed([cats + "dog", cats, "dog"]).vectors
    assert float(both @ first) > 0.99
    assert float(both @ first) > float(both @ last) + 0.2
    # A text of one window is unchanged by the weighing: its vector is the window's.
    short = embedder.embed(["a cat purrs"]).vectors[0]
    again = embedder.embed(["a cat purrs", cats + "dog"]).vectors[0]
    assert np.allclose(short, again, atol=1e-6)
