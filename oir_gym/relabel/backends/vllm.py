"""In-process vLLM backend (optional dependency, GPU)."""

from __future__ import annotations

from typing import Any, Optional

from oir_gym.relabel.backends.base import default_max_tokens, schema_shape

VLLM_INSTALL_HINT = (
    "VLLMBackend needs the optional dependency 'vllm' (Linux with a CUDA GPU): "
    "pip install 'oir-gym[vllm]' (or pip install vllm). Without a GPU use backend='llama_cpp' "
    "(offline, CPU), or run `vllm serve MODEL` on a GPU machine and use backend='openai' with "
    "base_url='http://HOST:8000/v1'."
)


class VLLMBackend:
    """Batched in-process generation with ``vllm.LLM`` and structured (JSON-schema) output.

    Args:
        model: a Hugging Face model name or local folder (e.g. ``"Qwen/Qwen3-8B"``, the paper's LLM).
        temperature, top_p, seed, max_tokens: sampling.
        **llm_kwargs: passed to ``vllm.LLM`` (``tensor_parallel_size``, ``gpu_memory_utilization``...).

    Raises:
        ImportError: with installation instructions when vllm is missing.
    """

    def __init__(
        self, model: str, *, temperature: float = 0.7, top_p: float = 0.95, seed: int = 0,
        max_tokens: Optional[int] = None, chat_template_kwargs: Optional[dict] = None, **llm_kwargs: Any,
    ) -> None:
        try:
            import vllm
        except ImportError as e:
            raise ImportError(VLLM_INSTALL_HINT) from e
        self._vllm = vllm
        self.model = model
        self.temperature, self.top_p, self.seed, self.max_tokens = temperature, top_p, seed, max_tokens
        self.chat_template_kwargs = chat_template_kwargs
        self._llm = vllm.LLM(model=model, seed=seed, **llm_kwargs)

    def _params(self, n: int, schema: Optional[dict]) -> Any:
        from vllm import SamplingParams

        kw: dict[str, Any] = dict(n=n, temperature=self.temperature, top_p=self.top_p, seed=self.seed,
                                  max_tokens=int(self.max_tokens or default_max_tokens(*schema_shape(schema))))
        if schema is not None:
            try:  # vllm >= 0.10.2
                from vllm.sampling_params import StructuredOutputsParams

                kw["structured_outputs"] = StructuredOutputsParams(json=schema)
            except ImportError:  # older vllm
                from vllm.sampling_params import GuidedDecodingParams

                kw["guided_decoding"] = GuidedDecodingParams(json=schema)
        return SamplingParams(**kw)

    def generate(self, prompts: list[str], n: int = 1, *, schema: Optional[dict] = None) -> list[list[str]]:
        """All prompts in one batched ``LLM.chat`` call."""
        convs = [[{"role": "user", "content": p}] for p in prompts]
        kw = {"chat_template_kwargs": self.chat_template_kwargs} if self.chat_template_kwargs else {}
        outs = self._llm.chat(convs, self._params(n, schema), use_tqdm=False, **kw)
        return [[o.text for o in r.outputs] for r in outs]
