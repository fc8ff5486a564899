"""AvgPipe at run time: elastic averaging of parallel pipelines and the online advance controller."""
