"""Watching an inference server the way production does: scrape its Prometheus endpoint into pandas
(`scrape`), compute what PromQL would (`promql`: rates, histogram quantiles, hit and acceptance rates),
alert on change against a trailing baseline (`alerts`), profile engine steps by named range (`profiling`),
and size a deployment from measured costs (`capacity`)."""
