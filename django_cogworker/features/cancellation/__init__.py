"""features/cancellation"""
