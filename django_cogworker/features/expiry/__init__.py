"""features/expiry"""
