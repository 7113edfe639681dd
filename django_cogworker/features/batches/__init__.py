"""features/batches"""
