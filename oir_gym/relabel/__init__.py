"""LLM hindsight instruction relabeling (paper section 4.1, prompt of Appendix C).

Typical use from any training loop::

    from oir_gym.relabel import HindsightRelabeler, RelabelerConfig

    relabeler = HindsightRelabeler(RelabelerConfig())          # offline Gemma 3 270M + rules, K = 4
    for res in relabeler(trajectories):                        # lock-step, like the paper
        for cand in res.grounded:                              # cand.first_step pays reward 1
            buffer.add(res.trajectory, cand.text, cand.first_step)
    metrics.update(relabeler.stats())

or off the critical path: ``relabeler.submit(trajs)`` then ``relabeler.collect()`` each iteration.
"""

from oir_gym.relabel.backends import (
    BackendError, BackendTimeout, LlamaCppBackend, LLMBackend, OpenAIBackend, TransformersBackend, VLLMBackend,
    default_gguf_path, make_backend,
)
from oir_gym.relabel.composite import CompositeBackend, Proposal
from oir_gym.relabel.cache import LRUCache
from oir_gym.relabel.filters import FORBIDDEN_PATTERNS, CandidateFilter, near_duplicate_mask, normalise
from oir_gym.relabel.parse import ParsedOutput, parse_candidates, parse_completion
from oir_gym.relabel.prompts import PromptTemplate, instruction_gbnf, load_template, output_schema, timestep_lines
from oir_gym.relabel.config import RelabelerConfig
from oir_gym.relabel.relabeler import HindsightRelabeler
from oir_gym.relabel.results import Candidate, RelabelResult
from oir_gym.relabel.rules import RULE_PAIRS, RuleBackend, rule_final_event
from oir_gym.relabel.segments import Segment, behaviour_key, segments, segments_text
from oir_gym.relabel.tokens import TokenCount, count_tokens

__all__ = [
    "RelabelerConfig",
    "HindsightRelabeler", "Candidate", "RelabelResult",
    "LLMBackend", "TransformersBackend", "LlamaCppBackend", "OpenAIBackend", "VLLMBackend", "RuleBackend", "CompositeBackend",
    "Proposal", "RULE_PAIRS", "rule_final_event", "BackendError", "BackendTimeout", "make_backend", "default_gguf_path", "instruction_gbnf",
    "PromptTemplate", "load_template", "output_schema", "timestep_lines", "count_tokens", "TokenCount",
    "parse_completion", "parse_candidates", "ParsedOutput",
    "CandidateFilter", "normalise", "near_duplicate_mask", "FORBIDDEN_PATTERNS",
    "Segment", "segments", "segments_text", "behaviour_key", "LRUCache",
]
