"""Exercise 14.3: why a rejected draft is replaced from the leftover max(0, P - P_hat), not from P."""
import torch
from longctx import ch08

target = torch.tensor([0.40, 0.25, 0.15, 0.12, 0.08])  # the chapter's five-token P
draft = torch.tensor([0.20, 0.45, 0.05, 0.10, 0.20])  # and its draft's P_hat
alpha = ch08.acceptance_rate(target, draft)
kept = torch.minimum(target, draft)  # P_hat(x) min(1, P(x) / P_hat(x))
leftover = (target - draft).clamp(min=0) / (1 - alpha)
right = kept + (1 - alpha) * leftover
wrong = kept + (1 - alpha) * target
assert torch.allclose(right, target, atol=1e-6)
too_likely = (wrong > target + 1e-6).nonzero().flatten().tolist()
# out - P = min(P, P_hat) - alpha P: too likely where the kept path alone gives more than alpha P
assert too_likely == (kept > alpha * target).nonzero().flatten().tolist() == [1, 3, 4], too_likely
print("ok ch08", round(float(alpha), 3), too_likely)
