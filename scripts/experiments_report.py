def charts(out):
    return []
def update_docs(out, path):
    pass
