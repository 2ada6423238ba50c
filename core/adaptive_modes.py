"""DELIVERY_ADAPTIVE_CONCURRENCY's values, spelt once for the settings that parse it and
the models that read it: whose in-flight limits adapt to how they answer."""

ADAPT_NONE = "off"  # none: each cap is the limit, fixed
ADAPT_UNCAPPED = "uncapped"  # the endpoints without a cap of their own
ADAPT_ALL = "all"  # every endpoint, a set cap being its ceiling

# Every spelling the setting accepts, and the value each means: the words of the boolean
# it once was keep working.
SPELLINGS = {
    ADAPT_UNCAPPED: ADAPT_UNCAPPED,
    **dict.fromkeys((ADAPT_ALL, "true", "1", "yes", "on"), ADAPT_ALL),
    **dict.fromkeys((ADAPT_NONE, "false", "0", "no", "none"), ADAPT_NONE),
}
