"""A password hasher for the test process only (tests/conftest.py, `quick_password_hashing`)."""
from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """Django's PBKDF2 at one iteration instead of a million, so creating and signing in the
    test users costs nothing. The algorithm's name is unchanged and a hash carries its
    iteration count, so a web process a test starts, with the default hashers, still checks
    these passwords."""

    iterations = 1
