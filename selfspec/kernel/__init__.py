"""selfspec's CPU kernel for few-row products (`few_row_linear.py` and its C source)."""
