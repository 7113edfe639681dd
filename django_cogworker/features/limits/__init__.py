"""features/limits"""
