"""HTTP machinery shared by the HTTP and S3 services: header parsing, the one ranged GET, pools."""
