"""The bundle: its manifest (the contract between capture, store, replay and report), reading and
writing bundles in a store, the files and data it holds, and what it must never hold (secrets)."""
