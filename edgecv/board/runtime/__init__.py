"""Runtime: one executor replaying a static plan, one small backend per device kind."""
