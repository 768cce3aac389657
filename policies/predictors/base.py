"""Output-length predictor contract.

predict(seq) -> int: the predicted total number of output tokens of `seq`
    (>= 1). It must be a pure function of the request: the same request gets
    the same prediction however often and in whatever order it is asked, so a
    policy may call it from `key` on every step.
forget(request_id) -> None: the request is done; drop any cached state (the
    scheduling policies call it from `on_finish` to keep memory flat over
    million-request runs). A later predict for the same id must return the
    same value again.

Predictors read the sequence (never mutate it) and keep their own state.
"""
from __future__ import annotations


class OutputLengthPredictor:
    name = "base"

    def predict(self, seq) -> int:
        raise NotImplementedError

    def forget(self, request_id) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
