"""AvgPipe's advance at run time: the online controller (Algorithm 1) that runs a schedule one
iteration at a time and chooses the next advance from what all ranks measured."""
