"""core.database: the default database's connection and vendor without the proxy."""

import threading

from django.db import connection

from core.database import this_connection, vendor


def test_the_vendor_is_the_default_database_s() -> None:
    assert vendor() == connection.vendor


def test_this_connection_is_this_thread_s() -> None:
    """What `django.db.connection` reads through, in this thread and in another."""
    mine = this_connection()
    assert mine.alias == "default" and mine.settings_dict is connection.settings_dict
    assert this_connection() is mine
    seen = []
    worker = threading.Thread(target=lambda: seen.append(this_connection()))
    worker.start()
    worker.join()
    assert seen[0] is not mine and seen[0].alias == "default"
