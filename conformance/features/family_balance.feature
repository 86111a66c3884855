@dual-stack
Feature: Balancing over pods of mixed families
  duet picks the pod first and its address second, so a dual-stack pod, an IPv4-only pod and an
  IPv6-only pod of one Service each get an equal share of the requests, whatever the client's
  family: a pod without the client's family is reached over its other one.
  (duet's default balancer, P2C over requests in flight, picks uniformly among idle pods, so 600
  sequential requests give each of 3 pods 200 on average, standard deviation 11.5; round robin
  gives exactly 200. 150..250 is 4.3 standard deviations each way: a correct balancer fails this
  about once in 27 000 runs per profile, while one weighting pods by their addresses (300/150/150)
  fails it always.)

  Scenario: Each pod of a mixed-family Service serves an equal share of the requests
    Given a new random namespace
    Given a Service "mixed" with these pods:
      | pod          | ipv4   | ipv6   |
      | mixed-dual   | listen | listen |
      | mixed-v4only | listen | absent |
      | mixed-v6only | absent | listen |
    Given an Ingress resource named "family-balance" with this spec:
    """
    rules:
    - host: family-balance
      http:
        paths:
        - path: /
          pathType: Prefix
          backend:
            service:
              name: mixed
              port:
                number: 8080
    """
    Then The Ingress status shows the IP address or FQDN where it is exposed
    When I send 600 requests to "http://family-balance"
    Then every response status-code must be 200
    And each of the pods "mixed-dual,mixed-v4only,mixed-v6only" must serve between 150 and 250 of the requests
    And the pod "mixed-dual" must be reached over the client's address family
    And the pod "mixed-v4only" must be reached over IPv4
    And the pod "mixed-v6only" must be reached over IPv6
