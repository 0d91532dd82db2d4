"""Test helpers shared by the test suite, the benchmarks and plugin authors (as ``triton.testing`` is).

``kregress.testing.fake_gateway``: a scripted OpenAI-compatible HTTP server on 127.0.0.1 (stdlib only) that
the real openai SDK talks to, and a clock that only moves when the code under test sleeps. Nothing here
imports Dagster, Triton or torch.
"""

from kregress.testing.fake_gateway import FakeClock, FakeOpenAI, Reply, Seen, count_tokens, prompt_tokens_of

__all__ = ["FakeClock", "FakeOpenAI", "Reply", "Seen", "count_tokens", "prompt_tokens_of"]
