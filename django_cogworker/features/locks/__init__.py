"""features/locks"""
