"""Long URLs wrap after their separators, never inside a host, and stay escaped."""

from dashboards.templatetags.urls_text import breakable


def test_a_url_may_break_after_each_separator_and_nowhere_in_its_host() -> None:
    shown = breakable("https://hooks.example.com:8443/a/b?x=1&y=2")

    assert shown == (
        "https://<wbr>hooks.example.com:8443/<wbr>a/<wbr>b?<wbr>x=<wbr>1&amp;<wbr>y=<wbr>2"
    )


def test_what_is_not_a_separator_is_escaped() -> None:
    shown = breakable('<script>alert("x")</script>')

    assert "<script>" not in shown and "&lt;script&gt;" in shown
    assert breakable(None) == ""
