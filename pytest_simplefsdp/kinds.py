"""The closed vocabularies of the records every step passes on: a cell's status, its failure class, the
tier and device it ran on, a mutant's fate. Each is a str enum, so it is stored, compared and printed
as its plain word (``Status.PASSED == "passed"``) while an unknown word is refused where it is made."""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    def __str__(self):
        return self.value

    def __repr__(self):  # messages quote the word as the user wrote it
        return repr(self.value)

    @classmethod
    def of(cls, value):
        """The member for a word (None stays None); a ValueError names the word and the known ones."""
        if value is None or isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a {cls.__name__}: one of {', '.join(m.value for m in cls)}") from None


class Status(Word):
    """A cell's pytest outcome."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    XFAILED = "xfailed"
    XPASSED = "xpassed"


class FailureClass(Word):
    """Why a cell failed, from its ranks' exit codes, logs and checks (see results.classify)."""

    INVALID_CONFIG = "invalid_config"
    COMPILE = "compile"
    RUNTIME = "runtime"
    CRASH = "crash"
    HANG = "hang"
    NO_RESULT = "no_result"
    NUMERICS = "numerics"
    INFRA = "infra"


class GateClass(Word):
    """A failure of a pull request's run judged against its base (--simplefsdp-base), as PyTorch's Dr. CI sorts them;
    only NEW fails the gate."""

    NEW = "new"  # fails on the PR, passes on the base (or fails there differently)
    BROKEN_TRUNK = "broken trunk"  # fails on the base too, with the same signature
    FLAKY = "flaky"  # one of the PR's runs passed, or the base failed the same way and passed
    KNOWN = "known"  # a known-failures entry expects it


class Tier(Word):
    REAL = "real"  # every rank runs on the profile's device
    TRACE = "trace"  # one simulated rank per cell on this CPU machine (torchtitan's fake backend)


class Device(Word):
    CPU = "cpu"  # gloo ranks
    CUDA = "cuda"  # nccl ranks, one GPU per rank


class Mutation(Word):
    """What the mutation tier found for one mutant in one cell."""

    KILLED = "killed"
    SURVIVED = "survived"
    INCONCLUSIVE = "inconclusive"


class KnownKind(Word):
    """How a known-failure entry treats the cells it applies to."""

    XFAIL = "xfail"  # run it, expect this failure
    FLAKY = "flaky"  # pass, or this failure and a rerun that passes (pass_rate says how many reruns)
    SKIP = "skip"  # do not run it


class RecordType(Word):
    """The records of a stored run (results.jsonl lines)."""

    META = "meta"
    CELL = "cell"
    BASELINE = "baseline"
    DROPPED = "dropped"


class Coverage(Word):
    """How far our profiles run one of upstream's tests (report.coverage)."""

    COVERED = "covered"
    PARTLY = "partly"
    NONE = "none"


class Change(Word):
    """What changed for a cell between a compared run and this one (report.compare)."""

    NEWLY_BROKEN = "newly broken"
    NEWLY_FIXED = "newly fixed"
    CHANGED_SIGNATURE = "changed signature"
    FLAKY_FLIP = "flaky flip"  # a known flaky cell that passed in one run and failed in the other
