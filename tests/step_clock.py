"""The clock the tests give the time-budgeted scripts of bench/ (their ``main(argv, clock=...)``): it moves only
when read, by a fixed step, or when a test advances it. What a budgeted run skips, and what it plans from the time
left, then follows from its steps and never from the machine's speed."""


class StepClock:
    def __init__(self, step: float = 1.0):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now

    def advance(self, seconds: float) -> None:
        """Time a piece of work stands for (a test's stand-in for a long section)."""
        self.now += seconds
