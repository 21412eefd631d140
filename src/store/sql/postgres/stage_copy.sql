COPY "{stage}" FROM STDIN (FORMAT binary)
