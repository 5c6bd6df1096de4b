"""Exercise 11.2: the saved run's settings give T_0, the base and the head width; count the slow bands."""
import math

from longctx import ch06, support

settings = support.load_results("extension")[0]["settings"]
trained = settings["trained_length"]
width = settings["d_model"] // settings["heads"]
plain, _ = ch06.recipe_bands("rope", width, factor=1, base=settings["bases"][0], original_context=trained)
slow = 2 * math.pi / plain > trained
for factor in (2, 4, 8):
    ntk, _ = ch06.recipe_bands("ntk", width, factor=factor, base=settings["bases"][0], original_context=trained)
    # NTK stretches every band but the fastest, so each slow band's wavelength grows
    assert bool(((2 * math.pi / ntk)[slow] > (2 * math.pi / plain)[slow]).all()), factor
print("ok ch06", int(slow.sum()), "slow bands of", plain.numel())
