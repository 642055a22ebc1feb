"""Sentry: tag the process's Sentry events with the bundle just captured, so an alert leads to its bundle.

The tag (``flaketriage.bundle.io``) goes on Sentry's current scope, so every event sent after the
capture in that scope carries the latest bundle id: typically the exception that ends a training
run right after a guard tripped. Nothing happens when ``sentry_sdk`` is not installed or not
initialized, and this module never imports it unless the program already did.
"""

from __future__ import annotations

import logging
import sys

TAG = "flaketriage.bundle"

log = logging.getLogger(__name__)


def tag_bundle(bundle_id: str) -> bool:
    """Set the ``flaketriage.bundle.io`` tag on the current Sentry scope; True when Sentry is active."""
    try:
        import sentry_sdk
    except ImportError:
        return False
    try:
        if not sentry_sdk.get_client().is_active():
            return False
        sentry_sdk.set_tag(TAG, bundle_id)
    except Exception as exc:  # a capture must never fail because of a Sentry integration
        log.debug("could not tag the Sentry scope with bundle %s: %s", bundle_id, exc)
        return False
    return True


def after_capture(bundle_id: str) -> str:
    """Hook run after an in-process capture; returns `bundle_id`. Free when Sentry is not imported."""
    if "sentry_sdk" in sys.modules:
        tag_bundle(bundle_id)
    return bundle_id
