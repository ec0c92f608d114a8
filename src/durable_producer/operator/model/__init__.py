"""The DurableProducer spec (the source of truth for the CRD), quantities and conditions.

Imported by everything else in the operator; imports neither ``decide/`` nor ``act/``.
"""
