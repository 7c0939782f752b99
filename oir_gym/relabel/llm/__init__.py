"""The LLM runtime by concern: :mod:`~oir_gym.relabel.llm.spec` (what a backend is, errors, causes
and remedies), :mod:`~oir_gym.relabel.llm.child` (a backend in a child process),
:mod:`~oir_gym.relabel.llm.caller` (one call at a time off the caller's thread),
:mod:`~oir_gym.relabel.llm.health` (outage warnings) and :mod:`~oir_gym.relabel.llm.build`
(``build_llm``, ``probe``).

Nothing is imported here, so a child process starts without loading more than it needs.
"""
