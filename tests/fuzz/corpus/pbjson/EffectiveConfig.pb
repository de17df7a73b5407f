
!
listen127.0.0.1:7700default