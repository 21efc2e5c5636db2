"""Cost arithmetic to the unit (pure functions, no I/O)."""
from decimal import Decimal

from models.records import Price
from relay.money.pricing import Usage, cost, to_units


def price(inp="0", out="0", cache="0", call="0"):
    return Price("m", "", Decimal(inp), Decimal(out), Decimal(cache), Decimal(call))


def test_per_token_formula():
    # 1000 prompt at $3/M + 500 completion at $15/M = 0.003 + 0.0075 = $0.0105
    assert cost(Usage(1000, 500), price("3", "15"), Decimal(1), False) == 5250


def test_cached_tokens_use_cache_price():
    # (1000-400)*3 + 400*0.3 + 500*15 = 1800 + 120 + 7500 = 9420 /1e6 USD -> 4710 units
    assert cost(Usage(1000, 500, 400), price("3", "15", "0.3"), Decimal(1), False) == 4710


def test_unset_cache_price_means_input_price():
    assert cost(Usage(1000, 0, 400), price("3"), Decimal(1), False) == 1500


def test_group_rate_multiplies():
    assert cost(Usage(1000, 500), price("3", "15"), Decimal("1.5"), False) == 7875
    assert cost(Usage(1000, 500), price("3", "15"), Decimal("0.5"), False) == 2625


def test_per_call():
    assert cost(Usage(1000, 500), price("3", "15", call="0.02"), Decimal(2), True) == 20000


def test_per_call_key_without_call_price_pays_per_token():
    assert cost(Usage(1000, 500), price("3", "15"), Decimal(1), True) == 5250


def test_call_only_model_bills_per_unit():
    # images: $0.04 each, n=3
    assert cost(Usage(units=3), price(call="0.04"), Decimal(1), False) == 60000


def test_rounding_half_up_and_minimum_one_unit():
    assert to_units(Decimal("0.000001")) == 1        # 0.5 units -> 1
    assert to_units(Decimal("0.0000001")) == 1       # 0.05 units: never free
    assert to_units(Decimal("0.000003")) == 2        # 1.5 -> 2
    assert to_units(Decimal(0)) == 0
    assert isinstance(to_units(Decimal("1.23")), int)


def test_cached_never_exceeds_prompt():
    assert cost(Usage(100, 0, 500), price("10", "0", "1"), Decimal(1), False) == 50
