"""Random operation sequences against a simple model of the queue, on every backend.

The model is a dict of jobs with their state, lease, attempts, idempotency key
and ``abandon`` mark.  After every step the store must agree with it: no job lost
or duplicated, one live lease at most per job, attempts within bounds, and
``stats()`` counting what the model counts -- a job arrives when it becomes
runnable (at enqueue, or when a delayed job's run_at comes), not when it is
enqueued.  The clock is the machine's ``now``, advanced by a rule.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from flexiqd.errors import JobNotFound
from flexiqd.queue import ClaimRequest, JobState, NewJob, Outcome, OutcomeKind
from flexiqd.queue.store.lifecycle import SWEEP_EVERY

T0 = 1_700_000_000.0
QUEUES = ("default", "other")
OWNERS = ("w1", "w2", "w3")
WINDOW = 60.0
# The backoff's ceiling: a failed job comes back no later than this.
MAX_RETRY_DELAY = 300.0


@dataclasses.dataclass
class ModelJob:
    queue: str
    priority: int
    run_at: float
    max_attempts: int
    key: str | None = None
    state: JobState = JobState.QUEUED
    attempts: int = 0
    owner: str | None = None
    expires: float | None = None
    mark: OutcomeKind | None = None  # what abandon asked for, applied when the owner is gone


class QueueMachine(RuleBasedStateMachine):
    def __init__(self, open_store):
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="flexiq-model-")
        self.backend = open_store(self.directory)
        self.now = T0
        self.jobs: dict[int, ModelJob] = {}
        self.executions = 0
        self.events: list[tuple[int, str, str]] = []  # (second, queue, arrival|completion|failure)
        self.delayed_arrivals: dict[int, float] = {}  # job id -> run_at, for jobs enqueued delayed
        self.swept = float("-inf")  # when a claim last looked for expired leases

    def teardown(self):
        self.backend.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- the model -------------------------------------------------------------------------

    def _in(self, state):
        return {job_id: job for job_id, job in self.jobs.items() if job.state is state}

    def _model_recover(self, owner=None):
        gone = {job_id: job for job_id, job in self._in(JobState.RUNNING).items()
                if (job.owner == owner if owner else job.expires < self.now)}
        for job_id, job in gone.items():
            mark, job.mark = job.mark, None
            job.owner = job.expires = None
            self.executions += 1
            if mark is OutcomeKind.RELEASE:
                # Given up at the end of a drain: no attempt used, same place.
                job.state, job.attempts = JobState.QUEUED, job.attempts - 1
                continue
            self.events.append((int(self.now), job.queue, "failure"))  # lost or failed: a failure
            if job.attempts >= job.max_attempts:
                job.state = JobState.DEAD
            elif mark is OutcomeKind.FAIL:
                job.state = JobState.QUEUED
                job.run_at = self._retry_time(job_id)
            else:
                job.state = JobState.QUEUED  # lost: keeps its place (run_at untouched)
        return len(gone)

    def _model_claim(self, owner, queues, limit, lease):
        # A claim looks for expired leases at most once a second (a busy worker's claims would
        # otherwise each pay for it): an expired job comes back within that second, not at once.
        if self.now - self.swept >= SWEEP_EVERY or self.now < self.swept:
            self._model_recover()
            self.swept = self.now
        chosen = []
        for queue in queues:
            runnable = sorted((job_id for job_id, job in self._in(JobState.QUEUED).items()
                               if job.queue == queue and job.run_at <= self.now),
                              key=lambda j: (-self.jobs[j].priority, self.jobs[j].run_at, j))
            chosen += runnable[:limit - len(chosen)]
        for job_id in chosen:
            job = self.jobs[job_id]
            job.state, job.owner, job.expires = JobState.RUNNING, owner, self.now + lease
            job.attempts += 1
        return chosen

    def _model_settle(self, owner, outcomes):
        settled = []
        for outcome in outcomes:
            job = self.jobs.get(outcome.job_id)
            if job is None or job.state is not JobState.RUNNING or job.owner != owner:
                continue
            settled.append(outcome.job_id)
            self.executions += 1
            job.mark = None
            kind = outcome.kind
            if kind is OutcomeKind.ACK:
                job.state = JobState.DONE
                self.events.append((int(self.now), job.queue, "completion"))
            elif kind is OutcomeKind.RELEASE:
                job.state, job.attempts = JobState.QUEUED, job.attempts - 1
            else:
                self.events.append((int(self.now), job.queue, "failure"))
                if kind is OutcomeKind.DEAD or job.attempts >= job.max_attempts:
                    job.state = JobState.DEAD
                else:
                    job.state = JobState.QUEUED
                    job.run_at = None  # chosen by the store's backoff: read back below
            job.owner = job.expires = None
        return settled

    def _retry_time(self, job_id):
        """The run_at the store's backoff chose for a retry (random: read back, then bounded)."""
        run_at = self.backend.get(job_id).run_at
        assert self.now < run_at <= self.now + MAX_RETRY_DELAY
        return run_at

    def _adopt_retry_times(self, settled):
        for job_id in settled:
            job = self.jobs[job_id]
            if job.state is JobState.QUEUED and job.run_at is None:
                job.run_at = self._retry_time(job_id)

    def _outcomes(self, picks, kinds, own):
        """Outcomes for picked jobs: running ones when ``own``, else any (someone else's, finished)."""
        running = sorted(self._in(JobState.RUNNING))
        ids = running if own and running else sorted(self.jobs)
        made = []
        for pick, kind in zip(picks, kinds):
            job_id = ids[pick % len(ids)]
            made.append({"ack": Outcome.ack(job_id, pick), "fail": Outcome.fail(job_id, f"e{pick}"),
                         "dead": Outcome.dead(job_id, f"d{pick}"),
                         "release": Outcome.release(job_id)}[kind])
        return made

    def _holder(self, outcomes, owner, own):
        """Settle as the holder of the first picked job when ``own``, else as ``owner``."""
        if own and outcomes:
            holder = self.jobs[outcomes[0].job_id].owner
            if holder is not None:
                return holder
        return owner

    # -- rules -----------------------------------------------------------------------------

    def _live_key_holder(self, key):
        return next((job_id for job_id, job in self.jobs.items() if job.key == key
                     and job.state in (JobState.QUEUED, JobState.RUNNING)), None)

    @rule(batch=st.lists(st.tuples(st.sampled_from([0.0, 0.0, 2.5, 15.0, 45.0]),
                                   st.integers(-1, 2), st.integers(1, 3), st.sampled_from(QUEUES),
                                   st.sampled_from([None, None, None, "k1", "k2"])),
                         min_size=1, max_size=4))
    def enqueue(self, batch):
        new = [NewJob(task="t", payload=i, delay=delay, priority=priority, max_attempts=attempts,
                      queue=queue, idempotency_key=key)
               for i, (delay, priority, attempts, queue, key) in enumerate(batch)]
        ids = self.backend.enqueue(new, now=self.now)
        assert len(ids) == len(new)
        for job_id, job in zip(ids, new):
            holder = self._live_key_holder(job.idempotency_key) if job.idempotency_key else None
            if holder is not None:
                assert job_id == holder, "a live idempotency key made a second job"
                continue
            assert job_id not in self.jobs, "an id was handed out twice"
            self.jobs[job_id] = ModelJob(queue=job.queue, priority=job.priority,
                                         run_at=self.now + job.delay, max_attempts=job.max_attempts,
                                         key=job.idempotency_key)
            if job.delay:
                self.delayed_arrivals[job_id] = self.now + job.delay  # arrives when it comes due
            else:
                self.events.append((int(self.now), job.queue, "arrival"))

    @rule(owner=st.sampled_from(OWNERS), limit=st.integers(1, 4),
          queues=st.sampled_from([("default",), ("other", "default"), ("default", "other")]),
          lease=st.sampled_from([5.0, 10.0, 30.0]))
    def claim(self, owner, limit, queues, lease):
        live = {j for j, job in self._in(JobState.RUNNING).items() if job.expires >= self.now}
        claimed = self.backend.claim(ClaimRequest(owner, queues, limit, lease), now=self.now)
        expected = self._model_claim(owner, queues, limit, lease)
        assert [job.id for job in claimed] == expected
        assert not live & set(expected), "a job with a live lease was leased again"
        for job in claimed:
            assert (job.state, job.lease_owner, job.lease_expires) == (
                JobState.RUNNING, owner, self.now + lease)

    @precondition(lambda self: self.jobs)
    @rule(picks=st.lists(st.integers(0, 1000), min_size=1, max_size=3),
          kinds=st.lists(st.sampled_from(["ack", "ack", "fail", "release", "dead"]), min_size=3, max_size=3),
          owner=st.sampled_from(OWNERS), own=st.sampled_from([True, True, True, False]))
    def settle(self, picks, kinds, owner, own):
        outcomes = self._outcomes(picks, kinds, own)
        owner = self._holder(outcomes, owner, own)
        settled = self.backend.settle(owner, outcomes, now=self.now)
        assert settled == self._model_settle(owner, outcomes)
        self._adopt_retry_times(settled)

    @precondition(lambda self: self.jobs)
    @rule(picks=st.lists(st.integers(0, 1000), max_size=2),
          kinds=st.lists(st.sampled_from(["ack", "fail", "release"]), min_size=2, max_size=2),
          owner=st.sampled_from(OWNERS), own=st.sampled_from([True, True, True, False]), limit=st.integers(0, 3))
    def settle_and_claim(self, picks, kinds, owner, own, limit):
        outcomes = self._outcomes(picks, kinds, own)
        owner = self._holder(outcomes, owner, own)
        request = ClaimRequest(owner, ("default",), limit, 10.0)
        settled, claimed = self.backend.settle_and_claim(owner, outcomes, request, now=self.now)
        assert settled == self._model_settle(owner, outcomes)
        self._adopt_retry_times(settled)
        expected = self._model_claim(owner, ("default",), limit, 10.0) if limit else []
        assert [job.id for job in claimed] == expected

    @precondition(lambda self: self.jobs)
    @rule(picks=st.lists(st.integers(0, 1000), min_size=1, max_size=3),
          owner=st.sampled_from(OWNERS), lease=st.sampled_from([5.0, 30.0]))
    def renew(self, picks, owner, lease):
        ids = sorted(self.jobs)
        asked = list(dict.fromkeys(ids[p % len(ids)] for p in picks))
        held = self.backend.renew(owner, asked, lease, now=self.now)
        # Held while running and leased to the owner, even past expiry: until a recovery
        # hands the job back, nothing else can have started it.
        expected = [j for j in asked if self.jobs[j].state is JobState.RUNNING
                    and self.jobs[j].owner == owner]
        assert held == expected
        for job_id in held:
            self.jobs[job_id].expires = self.now + lease

    @precondition(lambda self: self.jobs)
    @rule(picks=st.lists(st.integers(0, 1000), min_size=1, max_size=3),
          kinds=st.lists(st.sampled_from(["release", "fail"]), min_size=3, max_size=3),
          owner=st.sampled_from(OWNERS), own=st.sampled_from([True, True, True, False]))
    def abandon(self, picks, kinds, owner, own):
        outcomes = self._outcomes(picks, kinds, own)
        owner = self._holder(outcomes, owner, own)
        marked = self.backend.abandon(owner, outcomes, now=self.now)
        expected = []
        for outcome in outcomes:
            job = self.jobs[outcome.job_id]
            if job.state is JobState.RUNNING and job.owner == owner:
                job.mark = outcome.kind  # the job stays running and leased until the owner is gone
                expected.append(outcome.job_id)
        assert marked == expected

    @rule(seconds=st.sampled_from([0.5, 1.0, 4.0, 11.0, 31.0]))
    def advance_clock(self, seconds):
        self.now += seconds

    @rule()
    def recover_expired(self):
        assert self.backend.recover_expired(now=self.now) == self._model_recover()

    @rule(owner=st.sampled_from(OWNERS))
    def recover_owner(self, owner):
        assert self.backend.recover_owner(owner, now=self.now, reason="stopped") == self._model_recover(owner)

    @precondition(lambda self: self.jobs)
    @rule(pick=st.integers(0, 1000))
    def cancel(self, pick):
        ids = sorted(self.jobs)
        job_id = ids[pick % len(ids)]
        job = self.jobs[job_id]
        cancellable = job.state in (JobState.QUEUED, JobState.RUNNING, JobState.DEAD)
        assert self.backend.cancel(job_id, now=self.now) is cancellable
        if cancellable:
            if self.delayed_arrivals.get(job_id, self.now) > self.now:
                del self.delayed_arrivals[job_id]  # cancelled before it came due: never arrived
            job.state, job.owner, job.expires, job.mark = JobState.CANCELLED, None, None, None

    @rule()
    def cancel_unknown(self):
        try:
            self.backend.cancel(max(self.jobs, default=0) + 1000, now=self.now)
        except JobNotFound:
            return
        raise AssertionError("cancelling an unknown job must raise JobNotFound")

    @rule()
    def retry_dead(self):
        revived = 0
        # Newest first; a job whose key is live (or was just revived) stays dead.
        for job_id, job in sorted(self._in(JobState.DEAD).items(), reverse=True):
            if job.key is None or self._live_key_holder(job.key) is None:
                job.state, job.attempts, job.run_at = JobState.QUEUED, 0, self.now
                self.events.append((int(self.now), job.queue, "arrival"))  # back after leaving for good
                revived += 1
        assert self.backend.retry_dead(now=self.now) == revived

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def every_job_is_where_the_model_says(self):
        stored = {job.id: job for job in self.backend.list_jobs(limit=1_000_000)}
        assert set(stored) == set(self.jobs), "a job was lost or appeared from nowhere"
        for job_id, model in self.jobs.items():
            job = stored[job_id]
            assert job.state is model.state, (job_id, job, model)
            assert job.attempts == model.attempts, (job_id, job, model)
            assert 0 <= job.attempts <= job.max_attempts, job
            if job.state is JobState.RUNNING:
                # One holder, and a lease that is live or will be recovered.
                assert job.attempts >= 1
                assert (job.lease_owner, job.lease_expires) == (model.owner, model.expires)
            else:
                assert (job.lease_owner, job.lease_expires) == (None, None), job
            if job.state is JobState.QUEUED:
                assert job.run_at == model.run_at, (job_id, job, model)

    @invariant()
    def stats_count_what_the_model_counts(self):
        for queue in QUEUES:
            stats = self.backend.stats(queue, now=self.now, window=WINDOW)
            mine = [job for job in self.jobs.values() if job.queue == queue]
            runnable = [job.run_at for job in mine if job.state is JobState.QUEUED and job.run_at <= self.now]
            expected = (len(runnable),
                        sum(job.state is JobState.QUEUED and job.run_at > self.now for job in mine),
                        sum(job.state is JobState.RUNNING for job in mine),
                        sum(job.state is JobState.DEAD for job in mine))
            assert (stats.runnable, stats.delayed, stats.running, stats.dead) == expected, queue
            assert stats.oldest_runnable_age == pytest.approx(
                self.now - min(runnable) if runnable else 0.0)
            came_due = [(int(run_at), self.jobs[job_id].queue, "arrival")
                        for job_id, run_at in self.delayed_arrivals.items() if run_at <= self.now]
            recent = [kind for second, q, kind in self.events + came_due
                      if q == queue and second > self.now - WINDOW]
            assert stats.arrival_rate * WINDOW == pytest.approx(recent.count("arrival"))
            assert stats.completion_rate * WINDOW == pytest.approx(recent.count("completion"))
            assert stats.failure_rate * WINDOW == pytest.approx(recent.count("failure"))

    @invariant()
    def lease_owners_match_the_running_jobs(self):
        expected: dict[str, int] = {}
        for job in self._in(JobState.RUNNING).values():
            expected[job.owner] = expected.get(job.owner, 0) + 1
        assert self.backend.lease_owners() == expected

    @invariant()
    def every_ended_attempt_is_recorded_once(self):
        assert len(self.backend.executions()) == self.executions


@pytest.mark.slow
def test_random_operation_sequences_keep_the_model(backend_factory, backend_kind):
    # A PostgreSQL step is a few round trips, not a function call: fewer examples keep it fast.
    examples = 150 if backend_kind == "sqlite" else 30
    run_state_machine_as_test(
        lambda: QueueMachine(backend_factory),
        settings=settings(max_examples=examples, stateful_step_count=50, deadline=None, database=None))
