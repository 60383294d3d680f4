"""Django's settings for the doors' tests (pytest-django: pyproject.toml). The server's
address is the suite's embedded PostgreSQL, set when the test databases are made
(conftest.py: django_db_modify_db_settings)."""

SECRET_KEY = "tests-only"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "poller.contrib.django"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "poller_django",
        "HOST": "127.0.0.1",
        "USER": "postgres",
    },
    # Not PostgreSQL: the outbox refuses it by name (test_django.py).
    "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
