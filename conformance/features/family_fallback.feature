@dual-stack
Feature: Family fallback
  A pod whose address of one family refuses connections, while its EndpointSlice still lists
  that address as ready, serves through its other family: no request fails, whichever family
  the client uses.

  Scenario Outline: A pod whose <broken> port refuses connections serves over <other>
    Given a new random namespace
    Given a Service "half-open" with these pods:
      | pod            | ipv4   | ipv6   |
      | half-open-pod  | <ipv4> | <ipv6> |
      | half-open-dual | listen | listen |
    Given an Ingress resource named "family-fallback" with this spec:
    """
    rules:
    - host: family-fallback
      http:
        paths:
        - path: /
          pathType: Prefix
          backend:
            service:
              name: half-open
              port:
                number: 8080
    """
    Then The Ingress status shows the IP address or FQDN where it is exposed
    When I send 100 requests to "http://family-fallback"
    Then every response status-code must be 200
    # P2C over the two pods: the half-open pod serves Bin(100, 1/2) requests, mean 50, sd 5,
    # fewer than 30 with probability 1.6e-5 (exact binomial sum): once in ~15 000 runs of the 4
    # (2 examples x 2 profiles). A fallback that skips the pod after its port fails serves a few.
    And the pod "half-open-pod" must serve at least 30 of the requests
    And the pod "half-open-pod" must be reached over <other>

    Examples:
      | broken | ipv4   | ipv6   | other |
      | IPv4   | closed | listen | IPv6  |
      | IPv6   | listen | closed | IPv4  |
