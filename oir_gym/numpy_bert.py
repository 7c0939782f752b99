"""A numpy forward pass of a sentence-transformers BERT + mean pooling + Normalize model.

Needs only ``tokenizers``, ``safetensors.numpy`` and numpy (no torch import) and reproduces
sentence-transformers' embeddings in float32 (tests/test_encoder.py compares both routes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

_SCORE_BYTES = 64 << 20


def _read_json(path: Path) -> dict | list | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def is_supported(path: str | Path) -> bool:
    """True when ``path`` is a sentence-transformers folder Transformer(BERT) -> mean Pooling -> Normalize
    with safetensors weights and a fast-tokenizer ``tokenizer.json``."""
    p = Path(path)
    modules = _read_json(p / "modules.json")
    if not isinstance(modules, list) or len(modules) != 3:
        return False
    # module classes are named by an import path that moved between sentence-transformers versions
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if kinds != ["Transformer", "Pooling", "Normalize"] or not all(
            str(m.get("type", "")).startswith("sentence_transformers.") for m in modules):
        return False
    if modules[0].get("path", "") not in ("", "."):
        return False
    config = _read_json(p / "config.json")
    pooling = _read_json(p / modules[1].get("path", "") / "config.json")
    if not isinstance(config, dict) or not isinstance(pooling, dict):
        return False
    if "pooling_mode" in pooling:  # the newer folders' one field
        mean_only = pooling["pooling_mode"] == "mean"
    else:
        mean_only = pooling.get("pooling_mode_mean_tokens") is True and not any(
            pooling.get(k) for k in ("pooling_mode_cls_token", "pooling_mode_max_tokens",
                                     "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                                     "pooling_mode_lasttoken"))
    return (
        config.get("model_type") == "bert"
        and config.get("hidden_act") == "gelu"
        and config.get("position_embedding_type", "absolute") == "absolute"
        and mean_only
        and (p / "model.safetensors").is_file()
        and (p / "tokenizer.json").is_file()
    )


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to ~2e-7 absolute in float32 (Abramowitz & Stegun 7.1.26: 1.5e-7, plus float32 rounding)."""
    a1, a2, a3, a4, a5, p = 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429, 0.3275911
    ax = np.abs(x)
    t = np.float32(1.0) / (np.float32(1.0) + np.float32(p) * ax)
    poly = np.float32(a5) * t + np.float32(a4)
    for a in (a3, a2, a1):
        poly *= t
        poly += np.float32(a)
    poly *= t
    poly *= np.exp(-ax * ax)
    return np.copysign(np.float32(1.0) - poly, x)


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact (erf) GELU ``x/2 * (1 + erf(x/sqrt 2))`` in float32."""
    y = _erf(x * np.float32(1.0 / np.sqrt(2.0)))
    y += np.float32(1.0)
    y *= x
    y *= np.float32(0.5)
    return y


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = np.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


class NumpyBertEncoder:
    """Sentence embeddings of a BERT sentence-transformers folder (see :func:`is_supported`) in numpy float32.

    Truncates to ``max_seq_length`` of ``sentence_bert_config.json`` (capped by the position table) and
    pads each chunk to its longest text (masked: results do not depend on the chunking).
    """

    def __init__(self, path: str | Path) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        p = Path(path)
        if not is_supported(p):
            raise ValueError(f"{str(p)!r} is not a BERT + mean pooling + Normalize sentence-transformers folder")
        cfg = _read_json(p / "config.json")
        st_cfg = _read_json(p / "sentence_bert_config.json") or {}
        self.hidden = int(cfg["hidden_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.layers = int(cfg["num_hidden_layers"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        max_pos = int(cfg.get("max_position_embeddings", 512))
        self.max_seq_length = min(int(st_cfg.get("max_seq_length") or max_pos), max_pos)
        self.lower = bool(st_cfg.get("do_lower_case", False))
        #: the model folder
        self.path = str(p)

        self._tok = Tokenizer.from_file(str(p / "tokenizer.json"))
        self._tok.enable_truncation(max_length=self.max_seq_length)
        self._tok.no_padding()  # encode() pads each chunk to its longest text

        w = load_file(str(p / "model.safetensors"))
        w = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in w.items()}
        self._w = w
        # Transposed once: activations [tokens, in] @ [in, out].
        self._lin = {k[: -len(".weight")]: (np.ascontiguousarray(v.T), w[k[: -len(".weight")] + ".bias"])
                     for k, v in w.items() if k.startswith("encoder.layer.") and v.ndim == 2}

    def get_sentence_embedding_dimension(self) -> int:
        return self.hidden

    @property
    def settings(self) -> dict:
        """What the forward pass runs with besides the weights and the tokenizer's vocabulary."""
        return {"hidden": self.hidden, "heads": self.heads, "layers": self.layers, "eps": self.eps,
                "max_seq_length": self.max_seq_length, "lower": self.lower, "pooling": "mean", "normalize": True}

    def forward_weights(self) -> dict[str, np.ndarray]:
        """The weights the forward pass reads (names without the ``bert.`` prefix; not the pooler's)."""
        names = ("embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                 "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias")
        layers = tuple(f"encoder.layer.{i}." for i in range(self.layers))
        return {k: v for k, v in self._w.items() if k in names or k.startswith(layers)}

    def _dense(self, x: np.ndarray, name: str) -> np.ndarray:
        wt, b = self._lin[name]
        # One 2-D GEMM: numpy runs a 3-D @ 2-D product as one small GEMM per batch row.
        y = x.reshape(-1, x.shape[-1]) @ wt
        y += b
        return y.reshape(*x.shape[:-1], wt.shape[1])

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        w, eps = self._w, self.eps
        n, L = ids.shape
        valid = mask > 0
        # Dense layers run on the real tokens only ([T, hidden]); attention scatters them into the
        # padded [n, L] layout (padded keys are masked out, padded queries never read back).
        pos = np.broadcast_to(np.arange(L), (n, L))[valid]
        h = (w["embeddings.word_embeddings.weight"][ids[valid]]
             + w["embeddings.position_embeddings.weight"][pos]
             + w["embeddings.token_type_embeddings.weight"][0])
        h = _layer_norm(h, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        d = self.hidden // self.heads
        bias = np.where(valid[:, None, None, :], 0.0, np.finfo(np.float32).min).astype(np.float32)
        scale = np.float32(1.0 / np.sqrt(d))

        def heads(t: np.ndarray) -> np.ndarray:
            buf = np.zeros((n, L, self.hidden), np.float32)
            buf[valid] = t
            return buf.reshape(n, L, self.heads, d).transpose(0, 2, 1, 3)

        for i in range(self.layers):
            pre = f"encoder.layer.{i}."
            q = heads(self._dense(h, pre + "attention.self.query"))
            k = heads(self._dense(h, pre + "attention.self.key"))
            v = heads(self._dense(h, pre + "attention.self.value"))
            s = q @ k.transpose(0, 1, 3, 2)
            s *= scale
            s += bias
            s -= s.max(-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ v).transpose(0, 2, 1, 3)[valid].reshape(-1, self.hidden)
            a = self._dense(ctx, pre + "attention.output.dense")
            a += h
            h = _layer_norm(a, w[pre + "attention.output.LayerNorm.weight"],
                            w[pre + "attention.output.LayerNorm.bias"], eps)
            m = _gelu(self._dense(h, pre + "intermediate.dense"))
            o = self._dense(m, pre + "output.dense")
            o += h
            h = _layer_norm(o, w[pre + "output.LayerNorm.weight"], w[pre + "output.LayerNorm.bias"], eps)
        summed = np.zeros((n, self.hidden), np.float32)
        np.add.at(summed, np.nonzero(valid)[0], h)
        return summed / np.maximum(valid.sum(1, keepdims=True), 1).astype(np.float32)

    def encode(self, sentences: Sequence[str], batch_size: int = 32, convert_to_numpy: bool = True,
               normalize_embeddings: bool = True) -> np.ndarray:
        """Embed ``sentences`` -> ``[n, dim]`` float32 (L2-normalised, as the folder's Normalize module does)."""
        texts = [s.strip() for s in sentences]
        if self.lower:
            texts = [s.lower() for s in texts]
        out = np.zeros((len(texts), self.hidden), np.float32)
        if not texts:
            return out
        tokens = [e.ids for e in self._tok.encode_batch(texts)]  # truncated, not padded
        # Sorted by length so a chunk pads little; a chunk's [n, heads, L, L] scores stay under
        # _SCORE_BYTES however long its texts are.
        order = sorted(range(len(texts)), key=lambda i: -len(tokens[i]))
        start = 0
        while start < len(order):
            L = len(tokens[order[start]])
            n = max(1, min(int(batch_size), _SCORE_BYTES // (4 * self.heads * L * L)))
            idx = order[start:start + n]
            ids = np.zeros((len(idx), L), np.int64)
            mask = np.zeros((len(idx), L), np.int64)
            for r, i in enumerate(idx):
                ids[r, : len(tokens[i])] = tokens[i]
                mask[r, : len(tokens[i])] = 1
            out[idx] = self._forward(ids, mask)
            start += n
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return (out / np.maximum(norms, 1e-12)).astype(np.float32)
