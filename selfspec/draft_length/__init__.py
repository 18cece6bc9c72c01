"""How many tokens to draft each step: the "auto" policy (`policy`), its batch planner (`batch`), and the measured
cost of verifying k drafts that both plan with (`verify_cost`)."""
