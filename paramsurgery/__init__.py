"""paramsurgery"""
