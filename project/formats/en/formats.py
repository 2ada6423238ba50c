"""English date formats with seconds: a webhook's attempts are often seconds apart, and the
admin's default (`N j, Y, P`) shows them all as the same minute."""

DATETIME_FORMAT = "N j, Y, H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s"
TIME_FORMAT = "H:i:s"
