"""features/results"""
